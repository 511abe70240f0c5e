"""train-lora's training-curve page (components.train_lora._report): the summary table's "best" column."""

from __future__ import annotations

import re

from components.train_lora._report import render_curves


def _rows(page: str) -> dict[str, list[str]]:
    """Returns the summary table's cells per quantity (the `<code>` key of each row)."""
    table = page.split('<table class="summary">', 1)[1].split("</table>", 1)[0]
    rows = {}
    for tr in re.findall(r"<tr>(.*?)</tr>", table, re.S):
        cells = [re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", tr, re.S)]
        rows[cells[0]] = cells
    return rows


def _log() -> list[dict]:
    """Token accuracy rises from 0.0046 (a fresh adapter) while the loss falls; one eval pass per step 2 and 4."""
    log = [
        {"loss": 3.0 - 0.5 * i, "token_acc": [0.0046, 0.2, 0.45, 0.41][i], "grad_norm": 2.0 + i,
         "learning_rate": 1e-4 * (i + 1), "step": i + 1}
        for i in range(4)
    ]  # fmt: skip
    log.insert(2, {"eval_loss": 2.4, "eval_token_acc": 0.3, "step": 2})
    log.append({"eval_loss": 2.6, "eval_token_acc": 0.35, "step": 4})
    return log


def test_best_follows_each_quantitys_direction():
    rows = _rows(render_curves(_log()))
    header = rows["quantity"]
    assert "lowest" not in header and "best (lowest loss, highest accuracy)" in header
    # accuracy: the highest value is the best (0.45 at step 3), never the first 0.0046
    assert rows["token_acc"][4:] == ["0.45 (highest)", "3"]
    assert rows["eval_token_acc"][4:] == ["0.35 (highest)", "4"]
    # loss: the lowest value (1.5 at step 4; eval 2.4 at step 2, not its last 2.6)
    assert rows["loss"][4:] == ["1.5 (lowest)", "4"]
    assert rows["eval_loss"][4:] == ["2.4 (lowest)", "2"]
    # learning rate and grad norm are not better high or low: no best claimed
    for key in ("learning_rate", "grad_norm"):
        assert rows[key][4].startswith("—") and "lowest" not in rows[key][4] and "highest" not in rows[key][4]
    assert "0.0046" not in "".join(rows["token_acc"])


def test_loss_curve_summary_renders_in_chromium(tmp_path):
    from tests.browser import assert_not_blank, screenshot

    page = tmp_path / "loss_curve.html"
    page.write_text(render_curves(_log()), encoding="utf-8")
    img = screenshot(page, tmp_path / "train_lora_summary.png", (1200, 1100))
    assert_not_blank(img)
