"""Tests of components.validate_data.core on hand-made JSONL files and PNG images."""

from __future__ import annotations

import hashlib
import json
import socket
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from components.common.provenance import ORIGIN_KEY
from components.validate_data import _images, _read, _row_checks, _split, core
from components.validate_data._split import split_key
from components.validate_data.core import validate_data
from components.validate_data.types import CODES, DataError, LineAccountingError

# --- helpers -----------------------------------------------------------------------


def png(path: Path, size: tuple[int, int] = (64, 48), color=(200, 30, 30), mode: str = "RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, color).save(path)
    return path


def row(question: str, images: list[str] | None = None, answer: str | None = None, system: str | None = None) -> dict:
    images = images or []
    answer = fenced(0) if answer is None else answer
    messages = [
        {"role": "user", "content": "<image>" * len(images) + question},
        {"role": "assistant", "content": answer},
    ]
    if system:
        messages.insert(0, {"role": "system", "content": system})
    out = {"messages": messages}
    if images:
        out["images"] = images
    return out


def line(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)


def write_lines(path: Path, lines: list[str | bytes], eol: bytes = b"\n", bom: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = eol.join(x if isinstance(x, bytes) else x.encode("utf-8") for x in lines) + eol
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + raw)
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


class Run:
    """Output locations of one validate_data call under a folder."""

    def __init__(self, root: Path):
        self.train = root / "train_out"
        self.eval = root / "eval_out"
        self.quarantine = root / "quarantine" / "rejected.jsonl"

    def __call__(self, train_files, **kwargs):
        return validate_data(
            [str(f) for f in train_files], str(self.train), str(self.eval), str(self.quarantine), **kwargs
        )

    def rows(self) -> tuple[list[dict], list[dict]]:
        return read_jsonl(self.train / "data.jsonl"), read_jsonl(self.eval / "data.jsonl")

    def quarantined(self) -> list[dict]:
        return read_jsonl(self.quarantine)


@pytest.fixture
def data(tmp_path) -> Path:
    """A dataset folder with four good images."""
    folder = tmp_path / "data"
    for i in range(4):
        png(folder / "img" / f"d{i}.png", color=(i * 60, 100, 255 - i * 60))
    return folder


@pytest.fixture
def run(tmp_path) -> Run:
    return Run(tmp_path / "out")


def fenced(i: int) -> str:
    return f'```json\n[{{"label": "hole", "bbox": [{i}, 2, 30, 40]}}]\n```'


def good_rows(n: int = 4) -> list[dict]:
    return [row(f"find the holes in drawing {i}", [f"img/d{i % 4}.png"], answer=fenced(i)) for i in range(n)]


def closed_port() -> int:
    """A local TCP port nothing listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The options under which every check in CODES is active.
ALL_CHECKS = {"task": "detection", "max_length": 400, "fetch_timeout": 5.0}


# --- one bad line per check code ---------------------------------------------------


def bad_lines(folder: Path) -> dict[str, bytes | str]:
    """One line per code, each failing only that check."""
    png(folder / "tiny.png", size=(10, 10))
    png(folder / "big.png", size=(1024, 1024))  # ~1026 image tokens > max_length 400
    (folder / "broken.png").write_bytes(b"this is not a png at all")
    return {
        "E_ENCODING": b'{"messages": [{"role": "user", "content": "caf\xe9"}]}',
        "E_TOO_LONG": line(row("x" * 400)),
        "E_JSON": '{"messages": [{"role": "user", "content": "hi"}',
        "E_DUPLICATE_KEY": '{"messages": [{"role": "user", "content": "hi", "content": "<image>hi"}], "images": []}',
        "E_CONVERT": line({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "a"}], "n": 1}),
        "E_SCHEMA": line({"messages": [{"role": "user", "text": "hi"}, {"role": "assistant", "content": "a"}]}),
        "E_RESERVED_KEY": line({**row("q", ["img/d0.png"]), ORIGIN_KEY: {"file": "/etc/passwd", "line": 1}}),
        "E_MEDIA_KEY": line({**row("q", ["img/d0.png"]), "videos": ["clip.mp4"]}),
        "E_ROLE": line({"messages": [{"role": "human", "content": "hi"}, {"role": "assistant", "content": "a"}]}),
        "E_ORDER": line(
            {
                "messages": [
                    {"role": "user", "content": "a"},
                    {"role": "user", "content": "b"},
                    {"role": "assistant", "content": "c"},
                ]
            }
        ),
        "E_IMAGE_COUNT": line(
            {
                "messages": [
                    {"role": "user", "content": "<image><image>q"},
                    {"role": "assistant", "content": fenced(0)},
                ],
                "images": ["img/d0.png"],
            }
        ),
        "E_ANSWER": line(row("q", ["img/d0.png"], answer="two holes at [1, 2]")),
        "E_GOLD_FENCE": line(row("q", ["img/d0.png"], answer='```json\n[{"label": "hole", "bbox": [1, 2, 30, 40]}]')),
        "E_GOLD_BLOCKS": line(row("q", ["img/d0.png"], answer="```json\n[]\n```\n```json\n[]\n```")),
        "E_GOLD_DUPLICATE_KEY": line(
            row("q", ["img/d0.png"], answer='```json\n[{"label": "hole", "label": "pin", "bbox": [1, 2, 30, 40]}]\n```')
        ),
        "E_GOLD_MIXED_BOX_KEYS": line(
            row(
                "q",
                ["img/d0.png"],
                answer='```json\n[{"label": "hole", "bbox": [1, 2, 30, 40], "bbox_2d": [1, 2, 9, 9]}]\n```',
            )
        ),
        "E_IMAGE_PATH": line(row("q", ["../../etc/passwd"])),
        "E_IMAGE_FETCH": line(row("q", [f"http://127.0.0.1:{closed_port()}/a.png"])),
        "E_IMAGE_MISSING": line(row("q", ["img/nope.png"])),
        "E_IMAGE_UNREADABLE": line(row("q", ["broken.png"])),
        "E_IMAGE_SIZE": line(row("q", ["tiny.png"])),
        "E_BOX": line(row("q", ["img/d0.png"], answer='```json\n[{"label": "hole", "bbox": [10, 2, 300, 40]}]\n```')),
        "E_TOKENS": line(row("q", ["big.png"])),
        "E_DUPLICATE": line(good_rows()[0]),
    }


# Codes that need another setting than ALL_CHECKS: key_value gold (task key_value) and leakage (an eval file);
# tests/test_validate_data_integrity.py has a line for each.
OTHER_SETUP = {"E_GOLD_KEY_COLLISION", "E_GOLD_EMPTY_KEY", "E_LEAK"}


def test_every_code_has_a_bad_line(data):
    assert set(bad_lines(data)) == set(CODES) - OTHER_SETUP


@pytest.mark.parametrize("code", [c for c in CODES if c not in OTHER_SETUP])
def test_each_check_fires_on_its_own_line(data, run, monkeypatch, code):
    monkeypatch.setattr(_read, "MAX_LINE_BYTES", 300)
    good = [line(r) for r in good_rows()]
    assert all(len(g.encode()) < 300 for g in good)
    bad = bad_lines(data)[code]
    # good, good, BAD, good, good: the bad line is line 3
    path = write_lines(data / "train.jsonl", good[:2] + [bad] + good[2:])
    result = run([path], max_invalid_fraction=0.5, **ALL_CHECKS)

    assert len(result.issues) == 1
    issue = result.issues[0]
    assert (issue.file, issue.line, issue.code) == (str(path), 3, code)
    assert issue.message
    assert str(issue) == f"{path}:3: {code}: {issue.message}"
    assert result.counts[code] == 1
    assert result.counts["n_invalid"] == 1
    assert result.counts["n_valid"] == 4
    assert result.counts["n_lines"] == 5
    assert [k for k in CODES if k in result.counts] == [code]

    quarantined = run.quarantined()
    assert len(quarantined) == 1
    q = quarantined[0]
    assert set(q) == {"file", "line", "code", "message", "raw"}
    assert (q["file"], q["line"], q["code"], q["message"]) == (str(path), 3, code, issue.message)
    expected_raw = bad.decode("utf-8", errors="replace") if isinstance(bad, bytes) else bad
    assert q["raw"] == expected_raw

    train, evals = run.rows()
    kept = train + evals
    assert len(kept) == 4
    assert sorted(r["messages"][0]["content"] for r in kept) == sorted(
        json.loads(g)["messages"][0]["content"] for g in good
    )


def test_messages_name_the_problem(data, run, monkeypatch):
    monkeypatch.setattr(_read, "MAX_LINE_BYTES", 300)
    bad = bad_lines(data)
    good = [line(r) for r in good_rows()]
    codes = list(bad)
    path = write_lines(data / "train.jsonl", good + [bad[c] for c in codes])
    result = run([path], max_invalid_fraction=0.9, **ALL_CHECKS)
    by_code = {i.code: i for i in result.issues}
    assert [i.code for i in result.issues] == codes == [c for c in CODES if c in codes]  # in check order
    assert [i.line for i in result.issues] == list(range(5, 5 + len(codes)))
    assert "'human'" in by_code["E_ROLE"].message
    assert "'user' messages in a row" in by_code["E_ORDER"].message
    assert "2 <image> tag(s)" in by_code["E_IMAGE_COUNT"].message and "1 image(s)" in by_code["E_IMAGE_COUNT"].message
    assert "../../etc/passwd" in by_code["E_IMAGE_PATH"].message and "escapes" in by_code["E_IMAGE_PATH"].message
    assert "img/nope.png" in by_code["E_IMAGE_MISSING"].message
    assert "broken.png" in by_code["E_IMAGE_UNREADABLE"].message
    assert "10x10" in by_code["E_IMAGE_SIZE"].message
    # the duplicate points at the first occurrence
    assert f"{path}:1" in by_code["E_DUPLICATE"].message
    c = result.counts
    assert c["n_lines"] == 4 + len(codes)
    assert c["n_invalid"] == len(codes)
    assert c["n_valid"] + c["n_invalid"] == c["n_lines"]
    assert c["n_train"] + c["n_eval"] == c["n_valid"] == 4
    assert sum(c[k] for k in codes) == c["n_invalid"]
    assert len(run.quarantined()) == len(codes)
    assert [q["line"] for q in run.quarantined()] == [i.line for i in result.issues]


@pytest.mark.parametrize(
    "obj",
    [
        [1, 2],
        "just a string",
        {"conversation": []},
        {"messages": []},
        {"messages": "hi"},
        {"messages": [{"role": "user", "content": ["a"]}, {"role": "assistant", "content": "b"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "images": "img/d0.png"},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "images": [3]},
    ],
)
def test_schema_variants(data, run, obj):
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows()] + [line(obj)])
    result = run([path], max_invalid_fraction=0.5)
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_SCHEMA")]


@pytest.mark.parametrize(
    "roles",
    [
        ["user", "assistant", "user"],  # last message is not the assistant's
        ["assistant"],
        ["system", "assistant"],
        ["user", "system", "assistant"],
        ["user", "assistant", "assistant"],
    ],
)
def test_order_variants(data, run, roles):
    bad = {"messages": [{"role": r, "content": f"m{i}"} for i, r in enumerate(roles)]}
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows()] + [line(bad)])
    result = run([path], max_invalid_fraction=0.5)
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_ORDER")]


def test_system_prompt_and_multi_turn_are_valid(data, run):
    multi = {
        "messages": [
            {"role": "system", "content": "You find drawing features."},
            {"role": "user", "content": "<image>first?"},
            {"role": "assistant", "content": "[]"},
            {"role": "user", "content": "<image>second?"},
            {"role": "assistant", "content": "[]"},
        ],
        "images": ["img/d0.png", "img/d1.png"],
    }
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows()] + [line(multi)])
    result = run([path])
    assert result.counts["n_invalid"] == 0 and result.counts["n_valid"] == 5


# http(s), gs:// and base64 images are supported (tests/test_validate_data_sources.py);
# these forms are not.
@pytest.mark.parametrize(
    "ref",
    [
        "ftp://example.com/a.png",
        "gs://bucket-only",
        "data:image/png,not-base64",
        "../data/img/d0.png",
        "../../etc/passwd",
    ],
)
def test_image_path_variants(data, run, ref):
    path = write_lines(data / "sub" / "train.jsonl", [line(row(f"q{i}")) for i in range(4)] + [line(row("q", [ref]))])
    result = run([path], max_invalid_fraction=0.5)
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_IMAGE_PATH")]


def test_unusual_image_mode_is_a_size_error(data, run):
    Image.fromarray(np.zeros((40, 40), dtype=np.float32)).save(data / "float.tif")
    assert Image.open(data / "float.tif").mode == "F"
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows()] + [line(row("q", ["float.tif"]))])
    result = run([path], max_invalid_fraction=0.5)
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_IMAGE_SIZE")]
    assert "'F'" in result.issues[0].message


def test_truncated_png_is_unreadable(data, run):
    full = (data / "img" / "d0.png").read_bytes()
    (data / "cut.png").write_bytes(full[: len(full) // 2])
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows()] + [line(row("q", ["cut.png"]))])
    result = run([path], max_invalid_fraction=0.5)
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_IMAGE_UNREADABLE")]


def test_same_image_bytes_under_another_name_is_a_duplicate(data, run):
    (data / "copy.png").write_bytes((data / "img" / "d0.png").read_bytes())
    first = good_rows()[0]
    again = json.loads(json.dumps(first))
    again["images"] = ["copy.png"]
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows()] + [line(again)])
    result = run([path], max_invalid_fraction=0.5)
    assert [(i.line, i.code) for i in result.issues] == [(5, "E_DUPLICATE")]


def test_same_messages_with_different_image_is_not_a_duplicate(data, run):
    rows = good_rows()
    other = json.loads(json.dumps(rows[0]))
    other["images"] = ["img/d1.png"]
    path = write_lines(data / "train.jsonl", [line(r) for r in rows] + [line(other)])
    assert run([path]).counts["n_valid"] == 5


# --- good lines --------------------------------------------------------------------


def test_good_lines_pass_through_unchanged(data, run):
    rows = good_rows()
    rows[1]["source"] = {"ref": ["hole"]}  # extra fields survive (not `objects`: ms-swift reads that one, see below)
    text_only = row("no image here, just text")
    rows.append(text_only)
    path = write_lines(data / "train.jsonl", [line(r) for r in rows])
    result = run([path])
    assert result.issues == []
    assert result.train_dir == str(run.train) and result.eval_dir == str(run.eval)
    train, evals = run.rows()
    assert len(train) + len(evals) == len(rows)
    assert evals, "eval set is empty"

    by_question = {r["messages"][0]["content"]: r for r in rows}
    for out_dir, out_rows in ((run.train, train), (run.eval, evals)):
        for out in out_rows:
            src = by_question[out["messages"][0]["content"]]
            assert out["messages"] == src["messages"]
            kept = {k: v for k, v in out.items() if k not in ("images", ORIGIN_KEY)}
            assert kept == {k: v for k, v in src.items() if k != "images"}
            origin = out[ORIGIN_KEY]  # provenance: the user's file, line and image names (tests/test_provenance.py)
            assert origin["file"] == str(path) and rows[origin["line"] - 1] == src
            assert origin["images"] == src.get("images", [])
            assert len(out.get("images", [])) == len(src.get("images", []))
            assert ("images" in out) == ("images" in src)
            for ref, src_ref in zip(out.get("images", []), src.get("images", [])):
                assert not Path(ref).is_absolute()
                assert ref.startswith("images/")
                src_bytes = (data / src_ref).read_bytes()
                assert (out_dir / ref).read_bytes() == src_bytes
                assert Path(ref).name == hashlib.sha256(src_bytes).hexdigest()[:20] + ".png"
    n_files = len(list((run.train / "images").iterdir())) + len(list((run.eval / "images").iterdir()))
    assert result.counts["n_images"] == n_files


def test_image_shared_by_rows_is_written_once(data, run):
    """Rows sharing an image are written with one copy of it, all on one side of the split (issue #41: the
    split used to put some in eval, which then measured memorisation)."""
    rows = [row(f"question {i}", ["img/d0.png"]) for i in range(6)] + [row("other", ["img/d1.png"])]
    path = write_lines(data / "train.jsonl", [line(r) for r in rows])
    result = run([path])
    train, evals = run.rows()
    assert len(train) + len(evals) == 7
    assert {len(train), len(evals)} == {1, 6}
    for split, folder in ((train, run.train), (evals, run.eval)):
        assert len({r["images"][0] for r in split}) == 1
        assert len(list((folder / "images").iterdir())) == 1
    assert result.counts["n_images"] == 2 and result.counts["n_leaked"] == 0


def test_absolute_image_paths_are_accepted(tmp_path, run):
    elsewhere = png(tmp_path / "elsewhere" / "abs.png", size=(30, 40))
    rows = [row(f"q{i}", [str(elsewhere)]) for i in range(3)]
    path = write_lines(tmp_path / "data" / "train.jsonl", [line(r) for r in rows])
    result = run([path])
    assert result.counts["n_invalid"] == 0 and result.counts["n_valid"] == 3
    train, evals = run.rows()
    for out_dir, out_rows in ((run.train, train), (run.eval, evals)):
        for r in out_rows:
            assert r["images"][0].startswith("images/")
            assert (out_dir / r["images"][0]).read_bytes() == elsewhere.read_bytes()


def test_image_suffix_is_lowercased(data, run):
    png(data / "UPPER.PNG")
    path = write_lines(data / "train.jsonl", [line(row(f"q{i}", ["UPPER.PNG"])) for i in range(2)])
    run([path])
    train, evals = run.rows()
    assert all(r["images"][0].endswith(".png") for r in train + evals)


# --- counts and the policy ---------------------------------------------------------


def test_counts_match_the_input(data, run):
    good = [line(r) for r in good_rows(10)]
    bad = ["{nope", line({"messages": []}), line(row("q", ["img/missing.png"]))]
    lines = good[:3] + [bad[0]] + good[3:7] + [bad[1], bad[2]] + good[7:]
    path = write_lines(data / "train.jsonl", lines)
    result = run([path], max_invalid_fraction=0.5)
    c = result.counts
    assert c["n_lines"] == len(lines) == 13
    assert c["n_invalid"] == 3
    assert c["n_valid"] == 10  # images repeat every 4 rows but the questions differ: no duplicates
    assert c["n_valid"] + c["n_invalid"] == c["n_lines"]
    assert c["n_train"] + c["n_eval"] == c["n_valid"]
    train, evals = run.rows()
    assert (len(train), len(evals)) == (c["n_train"], c["n_eval"])
    assert len(run.quarantined()) == c["n_invalid"]
    assert (c["E_JSON"], c["E_SCHEMA"], c["E_IMAGE_MISSING"]) == (1, 1, 1)


def test_zero_tolerance_raises_with_summary(data, run):
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows()] + ["{broken"])
    with pytest.raises(DataError) as info:
        run([path], max_invalid_fraction=0.0)
    msg = str(info.value)
    assert "1 of 5 lines invalid" in msg
    assert "5 lines: 4 valid" in msg and "1 quarantined" in msg
    assert "E_JSON: 1" in msg
    assert f"{path}:5: E_JSON:" in msg
    # the quarantine is still written, so the bad lines can be inspected
    assert [(q["line"], q["code"]) for q in run.quarantined()] == [(5, "E_JSON")]


def test_tolerated_fraction_quarantines_and_writes_the_rest(data, run):
    lines = [line(r) for r in good_rows()] + ["{broken"]
    path = write_lines(data / "train.jsonl", lines)
    with pytest.raises(DataError):
        run([path], max_invalid_fraction=0.19)
    result = run([path], max_invalid_fraction=0.2)  # exactly 1 of 5 is tolerated
    assert result.counts["n_invalid"] == 1 and result.counts["n_valid"] == 4
    train, evals = run.rows()
    assert len(train) + len(evals) == 4
    assert [q["code"] for q in run.quarantined()] == ["E_JSON"]
    assert "E_JSON: 1" in result.summary()


def test_summary_lists_only_the_first_issues(data, run):
    lines = [line(r) for r in good_rows()] + [f"{{bad {i}" for i in range(12)]
    result = run([write_lines(data / "train.jsonl", lines)], max_invalid_fraction=1.0)
    s = result.summary(max_issues=3)
    assert s.count(": E_JSON: ") == 3
    assert f"... and 9 more in {run.quarantine}" in s


def test_all_lines_invalid_is_an_error(data, run):
    path = write_lines(data / "train.jsonl", ["{a", "{b"])
    with pytest.raises(DataError, match="no valid training rows"):
        run([path], max_invalid_fraction=1.0)


# --- files -------------------------------------------------------------------------


def test_empty_file_names_the_file(data, run):
    path = data / "train.jsonl"
    path.write_bytes(b"")
    with pytest.raises(DataError) as info:
        run([path])
    assert str(path) in str(info.value) and "empty" in str(info.value)


def test_blank_only_file_is_empty(data, run):
    path = write_lines(data / "train.jsonl", ["", "   ", "\t"])
    with pytest.raises(DataError, match="empty"):
        run([path])


def test_missing_file_names_the_file(data, run):
    path = data / "nope.jsonl"
    with pytest.raises(DataError) as info:
        run([path])
    assert str(path) in str(info.value) and "not found" in str(info.value)


def test_missing_eval_file_names_the_file(data, run):
    train = write_lines(data / "train.jsonl", [line(r) for r in good_rows()])
    with pytest.raises(DataError) as info:
        run([train], eval_files=[str(data / "eval.jsonl")])
    assert str(data / "eval.jsonl") in str(info.value)


def test_bom_and_crlf_are_accepted(data, run):
    lines = [line(r) for r in good_rows()]
    path = write_lines(data / "train.jsonl", lines, eol=b"\r\n", bom=True)
    result = run([path])
    assert result.issues == []
    assert result.counts["n_valid"] == 4
    train, evals = run.rows()
    assert sorted(json.dumps(r["messages"]) for r in train + evals) == sorted(
        json.dumps(json.loads(x)["messages"]) for x in lines
    )


def test_blank_lines_are_ignored_but_counted_for_line_numbers(data, run):
    good = [line(r) for r in good_rows()]
    lines = [good[0], "", "   ", good[1], "\r", "{bad", good[2], "", good[3]]
    path = write_lines(data / "train.jsonl", lines)
    result = run([path], max_invalid_fraction=0.5)
    assert result.counts["n_lines"] == 5
    assert [(i.line, i.code) for i in result.issues] == [(6, "E_JSON")]


# --- line accounting: train + eval + quarantined == non-blank lines read -----------


def test_line_accounting_holds_and_skips_blank_lines(data, run, monkeypatch):
    seen = []
    check = core._check_line_accounting

    def spy(files, train, held_out, rejected):
        n_rows = check(files, train, held_out, rejected)
        seen.append(([(f.n_read, f.n_blank) for f in files], n_rows, len(train) + len(held_out), len(rejected)))
        return n_rows

    monkeypatch.setattr(core, "_check_line_accounting", spy)
    good = [line(r) for r in good_rows(6)]
    one = write_lines(data / "one.jsonl", [good[0], "", "{bad", "  ", good[1], "\r", good[2]])
    two = write_lines(data / "two.jsonl", ["", good[3], good[0], good[4]])  # good[0]: a duplicate
    result = run([one, two], max_invalid_fraction=0.5)
    assert seen == [([(7, 3), (4, 1)], 7, 5, 2)]
    assert result.counts["n_lines"] == 7 == result.counts["n_valid"] + result.counts["n_invalid"]


def _drop_a_train_row(monkeypatch):
    split = _split.split_rows

    def lossy_split(checked, **kwargs):
        train, held_out = split(checked, **kwargs)
        return train[1:], held_out

    monkeypatch.setattr(_split, "split_rows", lossy_split)


def _drop_a_rejected_row(monkeypatch):
    check_rows = _row_checks.check_rows

    def lossy_check_rows(*args, **kwargs):
        checked, rejected = check_rows(*args, **kwargs)
        return checked, rejected[1:]

    monkeypatch.setattr(_row_checks, "check_rows", lossy_check_rows)


@pytest.mark.parametrize("lose", [_drop_a_train_row, _drop_a_rejected_row])
def test_a_lost_row_is_a_line_accounting_error(data, run, monkeypatch, lose):
    lose(monkeypatch)
    good = [line(r) for r in good_rows()]
    path = write_lines(data / "train.jsonl", good + ["", line(row("q", ["img/nope.png"]))])
    with pytest.raises(LineAccountingError) as info:
        run([path], max_invalid_fraction=0.5)
    message = str(info.value)
    assert "5 non-blank lines read" in message and f"{path}: 6 read, 1 blank" in message
    assert message.endswith("= 4"), message
    assert not isinstance(info.value, DataError)  # a bug here, not a problem of the data
    assert not run.quarantine.exists() and not run.train.exists()  # checked before anything is written


def test_several_train_files_are_combined(data, run):
    rows = good_rows(6)
    a = write_lines(data / "a.jsonl", [line(r) for r in rows[:3]])
    b = write_lines(data / "b.jsonl", [line(r) for r in rows[3:]] + [line(rows[0])])
    result = run([a, b], max_invalid_fraction=0.5)
    assert result.counts["n_valid"] == 6
    assert [(i.file, i.line, i.code) for i in result.issues] == [(str(b), 4, "E_DUPLICATE")]
    assert f"{a}:1" in result.issues[0].message


# --- eval set and the split --------------------------------------------------------


def eval_rows(data: Path, n: int) -> list[dict]:
    """Rows with images of their own (e0.png, ...): held-out rows no train row of `good_rows` gives away."""
    for i in range(n):
        png(data / "img" / f"e{i}.png", color=(10, 20 * i, 200))
    return [row(f"find the holes in held-out drawing {i}", [f"img/e{i}.png"], answer=fenced(i)) for i in range(n)]


def test_separate_eval_file_is_the_eval_set(data, run):
    rows = good_rows(5) + eval_rows(data, 3)
    train = write_lines(data / "train.jsonl", [line(r) for r in rows[:5]])
    held = write_lines(data / "eval.jsonl", [line(r) for r in rows[5:]])
    result = run([train], eval_files=[str(held)], eval_fraction=0.5)
    assert (result.counts["n_train"], result.counts["n_eval"]) == (5, 3)
    out_train, out_eval = run.rows()
    assert [r["messages"] for r in out_train] == [r["messages"] for r in rows[:5]]
    assert [r["messages"] for r in out_eval] == [r["messages"] for r in rows[5:]]
    for r in out_eval:
        assert (run.eval / r["images"][0]).is_file()


def test_eval_row_that_repeats_a_train_row_is_quarantined(data, run):
    rows = good_rows(4) + eval_rows(data, 2)
    train = write_lines(data / "train.jsonl", [line(r) for r in rows[:4]])
    held = write_lines(data / "eval.jsonl", [line(rows[4]), line(rows[1]), line(rows[5])])
    result = run([train], eval_files=[str(held)], max_invalid_fraction=0.2)
    assert [(i.file, i.line, i.code) for i in result.issues] == [(str(held), 2, "E_DUPLICATE")]
    assert result.counts["n_eval"] == 2 and result.counts["n_train"] == 4


def test_empty_eval_file_is_an_error(data, run):
    train = write_lines(data / "train.jsonl", [line(r) for r in good_rows()])
    held = data / "eval.jsonl"
    held.write_text("")
    with pytest.raises(DataError) as info:
        run([train], eval_files=[str(held)])
    assert str(held) in str(info.value)


def test_hash_split_is_deterministic(tmp_path, data):
    rows = [row(f"question {i}") for i in range(40)]
    path = write_lines(data / "train.jsonl", [line(r) for r in rows])
    first, second = Run(tmp_path / "one"), Run(tmp_path / "two")
    r1 = first([path], eval_fraction=0.3)
    r2 = second([path], eval_fraction=0.3)
    assert r1.counts == r2.counts
    assert (first.train / "data.jsonl").read_bytes() == (second.train / "data.jsonl").read_bytes()
    assert (first.eval / "data.jsonl").read_bytes() == (second.eval / "data.jsonl").read_bytes()
    # the split does not depend on the order of the lines
    shuffled = write_lines(data / "shuffled.jsonl", [line(r) for r in reversed(rows)])
    third = Run(tmp_path / "three")
    third([shuffled], eval_fraction=0.3)
    eval_q = lambda run: sorted(r["messages"][0]["content"] for r in run.rows()[1])  # noqa: E731
    assert eval_q(third) == eval_q(first)
    # another seed gives another split (40 rows: identical by chance is ~impossible)
    fourth = Run(tmp_path / "four")
    fourth([path], eval_fraction=0.3, split_seed="other")
    assert eval_q(fourth) != eval_q(first)


def test_hash_split_respects_the_fraction(data, run):
    rows = [row(f"question {i}") for i in range(400)]
    result = run([write_lines(data / "train.jsonl", [line(r) for r in rows])], eval_fraction=0.25)
    assert 60 <= result.counts["n_eval"] <= 140
    assert result.counts["n_train"] + result.counts["n_eval"] == 400


def test_split_key_is_stable_and_in_unit_interval():
    assert split_key("abc", "split-v1") == split_key("abc", "split-v1")
    assert split_key("abc", "split-v1") != split_key("abc", "split-v2")
    assert all(0.0 <= split_key(str(i), "s") < 1.0 for i in range(100))


def test_two_rows_put_one_in_eval(data, run):
    rows = [row("first"), row("second")]
    result = run([write_lines(data / "train.jsonl", [line(r) for r in rows])], eval_fraction=1e-9)
    assert (result.counts["n_train"], result.counts["n_eval"]) == (1, 1)


def test_one_row_has_nothing_to_evaluate(data, run):
    with pytest.raises(DataError, match="no valid eval rows"):
        run([write_lines(data / "train.jsonl", [line(row("only"))])], eval_fraction=1e-9)


# --- re-runs -----------------------------------------------------------------------


def test_rerun_into_the_same_folders(data, run):
    # regression: images are hard-linked into the output; a second run into the same
    # folders used to fail with shutil.SameFileError
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows()])
    first = run([path])
    first_rows = run.rows()
    second = run([path])
    assert second.counts == first.counts
    assert run.rows() == first_rows
    for out_dir, out_rows in zip((run.train, run.eval), run.rows()):
        for r in out_rows:
            assert (out_dir / r["images"][0]).is_file()


def test_changed_image_at_the_same_path_is_hashed_again(tmp_path, data):
    # regression: image hashes were cached per path for the whole process, so an image
    # rewritten in place kept its old hash (wrong output name, wrong duplicate check)
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows()])
    Run(tmp_path / "one")([path])
    png(data / "img" / "d0.png", size=(50, 50), color=(1, 2, 3))
    second = Run(tmp_path / "two")
    second([path])
    new_bytes = (data / "img" / "d0.png").read_bytes()
    train, evals = second.rows()
    for out_dir, out_rows in ((second.train, train), (second.eval, evals)):
        for r in out_rows:
            if r["messages"][0]["content"].endswith("drawing 0"):
                assert r["images"][0] == f"images/{hashlib.sha256(new_bytes).hexdigest()[:20]}.png"
                assert (out_dir / r["images"][0]).read_bytes() == new_bytes


def test_unchanged_image_is_hashed_once_per_process(tmp_path, data, monkeypatch):
    hashed = []
    sha256_file = _images.sha256_file
    monkeypatch.setattr(_images, "_SHA_CACHE", {})
    monkeypatch.setattr(_images, "sha256_file", lambda path, **kw: hashed.append(path) or sha256_file(path, **kw))
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows(8)])  # 8 rows, 4 images
    Run(tmp_path / "one")([path])
    Run(tmp_path / "two")([path])
    assert sorted(p.name for p in hashed) == [f"d{i}.png" for i in range(4)]


# --- box conventions (issue #18) ------------------------------------------------------


@pytest.mark.parametrize(
    ("convention", "bbox", "fragment"),
    [
        ("pixel", [10, 2, 65, 40], "outside [0, 0, 64, 48]"),  # the image is 64 x 48
        ("pixel", [30, 2, 10, 40], "x1 < x2"),
        ("norm1000", [10, 2, 1200, 40], "outside [0, 0, 1000, 1000]"),
        ("resized_pixel", [0, 0, 70, 40], "outside [0, 0, 56, 56]"),  # smart resize of 64 x 48: 56 x 56
    ],
)
def test_boxes_are_checked_in_their_convention(data, run, convention, bbox, fragment):
    answer = f'```json\n[{{"label": "hole", "bbox": {bbox}}}]\n```'
    good = [line(r) for r in good_rows()]
    path = write_lines(data / "train.jsonl", [*good, line(row("q", ["img/d0.png"], answer=answer))])
    result = run([path], max_invalid_fraction=0.5, task="detection", box_convention=convention)
    (issue,) = result.issues
    assert (issue.line, issue.code) == (5, "E_BOX") and fragment in issue.message, issue.message


def test_a_norm1000_box_beyond_a_small_image_is_fine_in_norm1000_but_not_in_pixel(data, run):
    answer = '```json\n[{"label": "hole", "bbox_2d": [100, 200, 900, 800]}]\n```'  # cookbook form
    rows = [line(r) for r in good_rows()] + [line(row(f"q{i}", ["img/d0.png"], answer=answer)) for i in range(3)]
    path = write_lines(data / "train.jsonl", rows)
    assert run([path], task="detection", box_convention="norm1000").counts["n_valid"] == 7
    assert run([path], task="detection", box_convention="pixel", max_invalid_fraction=0.5).counts["E_BOX"] == 3


def test_a_finding_without_a_label_is_a_box_error(data, run):
    answer = '```json\n[{"label": " ", "bbox": [1, 2, 30, 40]}]\n```'
    path = write_lines(
        data / "train.jsonl", [line(r) for r in good_rows()] + [line(row("q", ["img/d0.png"], answer=answer))]
    )
    result = run([path], task="detection", max_invalid_fraction=0.5)
    assert [i.code for i in result.issues] == ["E_BOX"] and "no label" in result.issues[0].message


def test_a_convention_other_than_the_models_own_is_a_warning(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["Qwen3VLForConditionalGeneration"], "model_type": "qwen3_vl"})
    )
    with pytest.warns(UserWarning, match="trained on norm1000"):
        check = _row_checks.box_check("detection", "pixel", str(tmp_path))
    assert check.convention == "pixel"
    assert _row_checks.box_check("detection", "auto", str(tmp_path)).convention == "norm1000"
    assert _row_checks.box_check("json", "pixel", str(tmp_path)) is None


# --- ms-swift's grounding form (issue #18) ---------------------------------------------


def _grounding(refs, boxes, text="<image>Find <ref-object>", answer="<bbox>", **extra):
    return {
        "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": answer}],
        "images": ["img/d0.png"],
        "objects": {"ref": refs, "bbox": boxes, **extra},
    }


@pytest.mark.parametrize(
    ("obj", "code", "fragment"),
    [
        (_grounding(["hole"], [[1, 2, 30, 40]]), None, ""),
        (_grounding(["hole"], [[0.1, 0.2, 0.5, 0.9]], bbox_type="norm1"), None, ""),
        (_grounding(["hole"], [[1, 2, 70, 40]]), "E_BOX", "outside [0, 0, 64, 48]"),  # the image is 64 x 48
        (_grounding(["hole"], [[0.1, 0.2, 1.5, 0.9]], bbox_type="norm1"), "E_BOX", "norm1"),
        (_grounding(["hole"], [[30, 2, 1, 40]]), "E_BOX", "x1 < x2"),
        (_grounding(["hole", "slot"], [[1, 2, 30, 40]]), "E_SCHEMA", "1 <ref-object> tag(s) in the messages but 2"),
        (_grounding(["hole"], [[1, 2, 30, 40]], answer="<bbox><bbox>"), "E_SCHEMA", "2 <bbox> tag(s)"),
        (_grounding(["hole"], [[1, 2, 30, 40]], bbox_type="norm1000"), "E_SCHEMA", "bbox_type"),
        (_grounding([""], [[1, 2, 30, 40]]), "E_SCHEMA", "non-empty strings"),
    ],
)
def test_ms_swift_grounding_rows_are_accepted_and_validated(data, run, obj, code, fragment):
    path = write_lines(data / "train.jsonl", [line(r) for r in good_rows()] + [line(obj)])
    result = run([path], task="detection", max_invalid_fraction=0.5)
    if code is None:
        assert result.issues == [] and result.counts["n_valid"] == 5
    else:
        (issue,) = result.issues
        assert issue.code == code and fragment in issue.message, issue.message


def test_each_dataset_folder_carries_its_token_figures(tmp_path, run):
    """train-lora's planner sizes micro-batches from these before it loads anything."""
    from components.common.dataset import read_token_stats

    rows = [line(row(f"{i}" + "q" * n)) for i, n in enumerate((1, 50, 400, 2000) * 3)]
    result = run([write_lines(tmp_path / "train.jsonl", rows)], eval_fraction=0.25, max_length=4000)
    for folder, key in ((run.train, "n_train"), (run.eval, "n_eval")):
        stats = read_token_stats(folder)
        assert stats is not None and stats["rows"] == result.counts[key]
        assert stats["max_tokens"] >= stats["p95_tokens"] >= 1 and stats["max_length"] == 4000
    both = read_token_stats(run.train)["max_tokens"], read_token_stats(run.eval)["max_tokens"]
    assert max(both) == max(result.stats["token_counts"])
    assert read_token_stats(tmp_path) is None  # no figures: None, the planner then says so
