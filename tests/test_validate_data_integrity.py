"""validate-data's row checks against careless and hostile input (issue #41, row checks).

Image paths no file can have (a NUL byte, a name over 255 bytes, a symlink loop), a
5,000-digit integer, outputs that cannot be written, the CLI's argument rules (those of the
config), train/eval leakage and EXIF orientation: each a quarantined row with a code or a
named error, never a traceback and never silent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from PIL import Image

from components.common.provenance import ORIGIN_KEY
from components.validate_data import core
from components.validate_data._convert import ConvertError, convert_file
from components.validate_data._paths import check_paths
from components.validate_data.types import DataError, Issue, ValidationResult, invalid_fraction
from tests.test_validate_data import Run, data, good_rows, line, png, row, run, write_lines  # noqa: F401 (fixtures)

CLI = [sys.executable, "-m", "components.validate_data"]
ROOT = Path(__file__).resolve().parents[1]


def good_lines() -> list[str]:
    return [line(r) for r in good_rows()]


def only_issue(result: ValidationResult, path: Path, code: str) -> Issue:
    """Returns the one quarantined line (line 5 of `path`) after checking that the four good rows were kept."""
    assert [(i.file, i.line, i.code) for i in result.issues] == [(str(path), 5, code)]
    assert result.counts["n_valid"] == 4
    return result.issues[0]


# --- image paths no file can have, and numbers Python will not read ------------------


def test_image_path_with_a_nul_byte_is_quarantined(data, run):
    path = write_lines(data / "train.jsonl", [*good_lines(), line(row("q", ["img/d0\u0000.png"]))])
    issue = only_issue(run([path], max_invalid_fraction=0.5), path, "E_IMAGE_PATH")
    assert "NUL byte" in issue.message


def test_image_name_over_255_bytes_is_quarantined(data, run):
    long_name = "é" * 130 + ".png"  # 264 bytes in UTF-8, 134 characters
    path = write_lines(data / "train.jsonl", [*good_lines(), line(row("q", [f"img/{long_name}"]))])
    issue = only_issue(run([path], max_invalid_fraction=0.5), path, "E_IMAGE_PATH")
    assert "264 bytes" in issue.message and "255" in issue.message


def test_relative_symlink_loop_is_quarantined(data, run):
    os.symlink(data / "img" / "loop.png", data / "img" / "loop.png")
    path = write_lines(data / "train.jsonl", [*good_lines(), line(row("q", ["img/loop.png"]))])
    issue = only_issue(run([path], max_invalid_fraction=0.5), path, "E_IMAGE_PATH")
    assert "symlink loop" in issue.message


def test_absolute_symlink_loop_is_named_as_a_loop(data, run):
    loop = data / "img" / "loop.png"
    os.symlink(loop, loop)
    path = write_lines(data / "train.jsonl", [*good_lines(), line(row("q", [str(loop)]))])
    issue = only_issue(run([path], max_invalid_fraction=0.5), path, "E_IMAGE_MISSING")
    assert "symlink loop" in issue.message and str(loop) in issue.message


def test_five_thousand_digit_integer_is_a_json_error(data, run):
    bad = line(row("q", ["img/d0.png"]))[:-1] + ', "n": ' + "9" * 5000 + "}"
    path = write_lines(data / "train.jsonl", [*good_lines(), bad])
    issue = only_issue(run([path], max_invalid_fraction=0.5), path, "E_JSON")
    assert "4300 digits" in issue.message and "as a string" in issue.message
    assert run.quarantined()[0]["raw"] == bad


# --- outputs that cannot be written: named before anything is read --------------------


@pytest.mark.parametrize("taken", ["report.html", "quarantine.jsonl"])
def test_cli_output_file_that_is_a_folder_is_named(data, tmp_path, taken):
    path = write_lines(data / "train.jsonl", good_lines())
    out = tmp_path / "out"
    (out / taken).mkdir(parents=True)
    done = subprocess.run([*CLI, str(path), "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{out / taken}: is a folder, but a file goes here" in done.stderr
    assert (out / taken).is_dir() and not (out / "train").exists()


def test_cli_out_that_is_a_file_is_named(data, tmp_path):
    path = write_lines(data / "train.jsonl", good_lines())
    out = tmp_path / "out"
    out.write_text("not a folder")
    done = subprocess.run([*CLI, str(path), "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"{out} is a file, not a folder" in done.stderr
    assert out.read_text() == "not a folder"


def test_dataset_folder_that_is_a_file_is_named(data, tmp_path):
    path = write_lines(data / "train.jsonl", good_lines())
    (tmp_path / "train_out").write_text("x")
    with pytest.raises(DataError, match=r"train_out .*train_out: is a file, but a dataset folder goes here"):
        core.validate_data([str(path)], str(tmp_path / "train_out"), str(tmp_path / "e"), str(tmp_path / "q.jsonl"))


def _check_paths_as_nobody(inputs: list[str], out: Path) -> str:
    """Runs check_paths in a forked child as user nobody (root may write anywhere); returns its error or ""."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, check, report through the pipe, exit without pytest's clean-up
        message = ""
        try:
            os.setgid(65534)
            os.setuid(65534)
            check_paths(inputs, train_out=str(out / "train"), eval_out=str(out / "eval"),
                             quarantine_out=str(out / "quarantine.jsonl"))  # fmt: skip
        except DataError as exc:
            message = str(exc)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the test
            message = f"unexpected {type(exc).__name__}: {exc}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        message = f.read().decode()
    os.waitpid(pid, 0)
    return message


def test_read_only_out_is_named(data):
    """As a user who cannot write --out (nobody, in a child, when the tests run as root: root writes anywhere)."""
    top = Path(tempfile.mkdtemp(prefix="vd-ro-", dir="/tmp"))
    try:
        os.chmod(top, 0o755)
        lines = write_lines(top / "train.jsonl", good_lines())
        out = top / "read-only"
        out.mkdir()
        os.chmod(out, 0o555)
        if os.geteuid() == 0:
            message = _check_paths_as_nobody([str(lines)], out)
        else:
            with pytest.raises(DataError) as caught:
                check_paths([str(lines)], train_out=str(out / "train"), eval_out=str(out / "eval"),
                                 quarantine_out=str(out / "quarantine.jsonl"))  # fmt: skip
            message = str(caught.value)
    finally:
        os.chmod(top / "read-only", 0o755)
        subprocess.run(["rm", "-rf", str(top)], check=True)
    assert f"the folder {out} is not writable by this user" in message


# --- gold answers parsed strictly --------------------------------------------------

KV_GOOD = [
    '```json\n{"invoice": "A-%d", "total": "1.00"}\n```' % i  # noqa: UP031 - the braces are JSON's
    for i in range(4)
]
KV_BAD = {
    "E_GOLD_FENCE": '```json\n{"invoice": "A-9", "total": "1.00"}',
    "E_GOLD_DUPLICATE_KEY": '```json\n{"total": "1.00", "total": "999.00"}\n```',
    "E_GOLD_KEY_COLLISION": '```json\n{"total": "1.00", "Total ": "999.00"}\n```',
    "E_GOLD_EMPTY_KEY": '```json\n{"": "1.00", "total": "2.00"}\n```',
}


@pytest.mark.parametrize("code", list(KV_BAD))
def test_key_value_bad_gold_is_quarantined_with_its_code(data, run, code):
    good = [line(row(f"read invoice {i}", [f"img/d{i}.png"], answer=a)) for i, a in enumerate(KV_GOOD)]
    path = write_lines(data / "train.jsonl", [*good, line(row("read it", ["img/d0.png"], answer=KV_BAD[code]))])
    result = run([path], max_invalid_fraction=0.5, task="key_value")
    issue = only_issue(result, path, code)
    assert str(issue).startswith(f"{path}:5: {code}: messages[1].content (assistant, the gold answer): ")
    assert result.counts[code] == 1
    assert run.quarantined()[0]["code"] == code


def test_detection_gold_with_two_different_boxes_is_quarantined(data, run):
    answer = '```json\n[{"label": "hole", "bbox": [1, 2, 30, 40], "bbox_2d": [100, 200, 300, 400]}]\n```'
    path = write_lines(data / "train.jsonl", [*good_lines(), line(row("q", ["img/d0.png"], answer=answer))])
    issue = only_issue(run([path], max_invalid_fraction=0.5, task="detection"), path, "E_GOLD_MIXED_BOX_KEYS")
    assert '"bbox_2d": [100, 200, 300, 400]' in issue.message and "keep one key" in issue.message


# --- train/eval leakage ------------------------------------------------------------


def held_out(data: Path, rows: list[dict]) -> Path:
    return write_lines(data / "eval.jsonl", [line(r) for r in rows])


def own_image(data: Path, i: int) -> str:
    png(data / "img" / f"e{i}.png", color=(5, 40 * i, 220))
    return f"img/e{i}.png"


def test_eval_rows_reusing_train_images_are_quarantined_as_leaks(data, run):
    train = write_lines(data / "train.jsonl", good_lines())  # d0..d3 on lines 1..4
    (data / "img" / "copy-of-d2.png").write_bytes((data / "img" / "d2.png").read_bytes())
    rows = [
        row("held-out question", [own_image(data, 0)]),
        row("what is drawn here?", ["img/d1.png"]),  # the same path, another prompt
        row("find the holes in drawing 3", ["img/d3.png"], answer="```json\n[]\n```"),  # same image and prompt
        row("another question", ["img/copy-of-d2.png"]),  # the same bytes under another name
    ]
    evals = held_out(data, rows)
    result = run([train], eval_files=[str(evals)])
    assert [(i.file, i.line, i.code) for i in result.issues] == [(str(evals), n, "E_LEAK") for n in (2, 3, 4)]
    assert result.counts["n_leaked"] == result.counts["E_LEAK"] == 3
    assert (result.counts["n_train"], result.counts["n_eval"]) == (4, 1)
    by_line = {i.line: i.message for i in result.issues}
    assert f"the same image (another prompt) as train row {train}:2" in by_line[2]
    assert f"the same image and prompt as train row {train}:4" in by_line[3]
    assert f"as train row {train}:3: image 'img/copy-of-d2.png' (in train: 'img/d2.png'), compared by" in by_line[4]
    assert all("leakage: warn" in m for m in by_line.values())  # the fix and the setting
    assert [r["images"] for r in run.rows()[1]] == [["images/" + n.name] for n in (run.eval / "images").iterdir()]
    assert result.stats["leaks"][0] == {
        "eval": f"{evals}:2", "train": [f"{train}:2"], "shared": "image", "images": ["img/d1.png"],
        "train_images": ["img/d1.png"], "match": ["bytes"],
    }  # fmt: skip
    assert [q["code"] for q in run.quarantined()] == ["E_LEAK"] * 3


def test_text_rows_with_a_train_prompt_leak(data, run):
    text_rows = [row(f"what is {i} + {i}?", answer=f"{2 * i}") for i in range(4)]
    train = write_lines(data / "train.jsonl", [line(r) for r in text_rows])
    evals = held_out(data, [row("what is 9 + 9?", answer="18"), row("what is 2 + 2?", answer="four")])
    result = run([train], eval_files=[str(evals)])
    assert [(i.line, i.code) for i in result.issues] == [(2, "E_LEAK")]
    assert f"the same prompt as train row {train}:3 (no image)" in result.issues[0].message


def test_leaks_do_not_count_against_max_invalid_fraction(data, run):
    train = write_lines(data / "train.jsonl", good_lines())
    evals = held_out(data, [row("q", [own_image(data, 0)]), row("q2", ["img/d0.png"])])
    result = run([train], eval_files=[str(evals)], max_invalid_fraction=0.0)  # the default: no invalid line
    assert result.counts["n_invalid"] == 1 and result.counts["E_LEAK"] == 1
    assert invalid_fraction(result.counts) == 0.0


def test_leakage_error_fails_naming_both_rows(data, run):
    train = write_lines(data / "train.jsonl", good_lines())
    evals = held_out(data, [row("q", [own_image(data, 0)]), row("q2", ["img/d0.png"])])
    with pytest.raises(DataError, match=rf"1 eval row\(s\) share .*eval {evals}:2 <- train {train}:1"):
        run([train], eval_files=[str(evals)], leakage="error")


def test_leakage_warn_keeps_the_rows_and_counts_them(data, run):
    train = write_lines(data / "train.jsonl", good_lines())
    evals = held_out(data, [row("q", [own_image(data, 0)]), row("q2", ["img/d0.png"])])
    with pytest.warns(UserWarning, match=rf"1 eval row\(s\) share .*{evals}:2 has the same image"):
        result = run([train], eval_files=[str(evals)], leakage="warn")
    assert (result.counts["n_eval"], result.counts["n_leaked"], result.counts.get("E_LEAK", 0)) == (2, 1, 0)
    assert result.issues == []


def test_hash_split_keeps_rows_sharing_an_image_on_one_side(data, run):
    """Four prompts per image: the old row-by-row split put some of an image's rows in eval, some in train."""
    rows = [row(f"question {k} about drawing {i}", [f"img/d{i}.png"]) for i in range(4) for k in range(4)]
    train = write_lines(data / "train.jsonl", [line(r) for r in rows])
    result = run([train], eval_fraction=0.3)
    out_train, out_eval = run.rows()
    assert out_eval and out_train
    origins = [{r[ORIGIN_KEY]["images"][0] for r in split} for split in (out_train, out_eval)]
    assert not origins[0] & origins[1]
    assert result.counts["n_leaked"] == 0


def test_report_has_a_leakage_section(data, tmp_path):
    train = write_lines(data / "train.jsonl", good_lines())
    evals = held_out(data, [row("q", [own_image(data, 0)]), row("q2", ["img/d0.png"])])
    out = tmp_path / "out"
    result = core.validate_data(
        [str(train)], str(out / "train"), str(out / "eval"), str(out / "q.jsonl"), eval_files=[str(evals)],
        report_out=str(out / "report.html"),
    )  # fmt: skip
    html = (out / "report.html").read_text(encoding="utf-8")
    section = html[html.index('<h2 id="leakage">') : html.index("<h2>Token length")]
    assert "1 eval row(s) share an image" in section and "quarantined (<code>E_LEAK</code>)" in section
    assert f"<code>{evals}:2</code>" in section and f"<code>{train}:1</code>" in section
    assert "img/d0.png" in section
    assert result.counts["n_leaked"] == 1


# --- the CLI's arguments, checked with the config's rules ----------------------------


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--eval-fraction", "0"), ("--eval-fraction", "-1"), ("--eval-fraction", "nan"), ("--eval-fraction", "1"),
     ("--max-invalid-fraction", "nan"), ("--max-invalid-fraction", "1.5"), ("--max-invalid-fraction", "-0.1")],
)  # fmt: skip
def test_cli_refuses_a_setting_the_config_refuses(data, tmp_path, flag, value):
    path = write_lines(data / "train.jsonl", good_lines())
    out = tmp_path / "out"
    done = subprocess.run([*CLI, str(path), flag, value, "--out", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"validate-data: {flag} must be a number between 0 and 1")
    assert "the rule of data." in done.stderr
    assert not out.exists()


def test_core_refuses_the_same_settings(data, run):
    path = write_lines(data / "train.jsonl", good_lines())
    for kwargs in ({"eval_fraction": float("nan")}, {"max_invalid_fraction": float("nan")}, {"leakage": "ignore"}):
        with pytest.raises(DataError, match=r"must be .* got"):
            run([path], **kwargs)


def test_cli_leakage_flag_reaches_the_core(data, tmp_path):
    train = write_lines(data / "train.jsonl", good_lines())
    evals = held_out(data, [row("q", [own_image(data, 0)]), row("q2", ["img/d0.png"])])
    out = tmp_path / "out"
    args = [*CLI, str(train), "--eval", str(evals), "--out", str(out), "--leakage", "error"]
    done = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"eval {evals}:2 <- train {train}:1" in done.stderr


# --- convert: boxes that rounding would erase, files that are not UTF-8 ----------------


def detection_file(folder: Path, boxes: list[list[int]], side: int = 2048) -> Path:
    png(folder / "big.png", size=(side, side))
    answers = ['```json\n[{"label": "dot", "bbox": %s}]\n```' % json.dumps(b) for b in boxes]  # noqa: UP031
    return write_lines(
        folder / "dots.jsonl", [line(row(f"find dot {i}", ["big.png"], answer=a)) for i, a in enumerate(answers)]
    )


def test_convert_refuses_a_box_that_rounds_to_no_area(tmp_path):
    src = detection_file(tmp_path, [[100, 100, 400, 300], [10, 10, 11, 11]])  # line 2: one pixel on 2048 px
    with pytest.raises(ConvertError) as caught:
        convert_file(src, tmp_path / "out.jsonl", to="norm1000")
    message = str(caught.value)
    assert message.startswith(
        f"{src}:2: messages[1] finding 0 ('dot'): box [10, 10, 11, 11] (pixel) becomes [5, 5, 5, 5]"
    )
    assert "2048x2048" in message and "without area" in message and "enlarge or remove it" in message
    assert not (tmp_path / "out.jsonl").exists()


def test_convert_keeps_boxes_that_survive(tmp_path):
    src = detection_file(tmp_path, [[100, 100, 400, 300], [10, 10, 16, 16]])  # 6 px: 4.9 -> 7.8, kept
    result = convert_file(src, tmp_path / "out.jsonl", to="norm1000")
    assert (result.rows, result.boxes) == (2, 2)


def test_convert_of_a_latin1_file_is_a_named_error(tmp_path):
    src = detection_file(tmp_path, [[100, 100, 400, 300]])
    src.write_bytes(src.read_bytes() + line(row("caf\u00e9", ["big.png"])).encode("latin-1") + b"\n")
    done = subprocess.run(
        [*CLI, "convert", str(src), "--to", "norm1000", "--out", str(tmp_path / "out.jsonl")],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith(f"convert: {src}:2: not UTF-8 at byte")
    assert "save the file as UTF-8" in done.stderr


def test_convert_of_a_missing_file_is_a_named_error(tmp_path):
    with pytest.raises(ConvertError, match="cannot be read"):
        convert_file(tmp_path / "nope.jsonl", tmp_path / "out.jsonl", to="norm1000")


# --- EXIF orientation: applied once, by validate-data, for training and evaluation ------


def sideways_jpeg(path: Path, orientation: int = 6) -> Path:
    """A 400x200 JPEG with a red block in its stored top-left corner, tagged to be shown turned (6: 90° clockwise)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.new("RGB", (400, 200), "white")
    img.paste((255, 0, 0), (0, 0, 60, 60))
    exif = Image.Exif()
    exif[0x0112] = orientation
    img.save(path, "JPEG", exif=exif.tobytes(), quality=95)
    return path


def box_answer(box: list[int]) -> str:
    return '```json\n[{"label": "block", "bbox": %s}]\n```' % json.dumps(box)  # noqa: UP031


def test_exif_rotated_jpeg_is_written_upright_and_boxes_read_on_the_upright_view(data, run):
    sideways_jpeg(data / "img" / "photo.jpg")
    # upright the photo is 200 wide, 400 tall, the red block in its top-right corner: y up to 400 is inside
    upright_row = row("find the block", ["img/photo.jpg"], answer=box_answer([140, 0, 200, 60]))
    tall = row("find the tall thing", ["img/photo.jpg"], answer=box_answer([10, 250, 150, 390]))
    path = write_lines(data / "train.jsonl", [*good_lines(), line(upright_row), line(tall)])
    result = run([path], task="detection")
    assert result.issues == [] and result.counts["n_exif_rotated"] == 1
    assert (200, 400) in result.stats["image_sizes"]
    rows = run.rows()[0] + run.rows()[1]
    written = next(r for r in rows if r["messages"][0]["content"].endswith("find the block"))
    folder = run.train if written in run.rows()[0] else run.eval
    image_file = folder / written["images"][0]
    with Image.open(image_file) as img:  # what ms-swift reads (it ignores EXIF) and evaluate sizes
        assert (img.format, img.size) == ("PNG", (200, 400))
        assert 0x0112 not in img.getexif()
        rgb = img.convert("RGB")
        assert rgb.getpixel((180, 20))[0] > 200 and rgb.getpixel((180, 20))[1] < 60  # the block, top right
        assert rgb.getpixel((20, 20)) > (200, 200, 200)  # white, top left
    from components.evaluate.core import image_size

    assert image_size(image_file) == (200, 400)


def test_box_on_the_stored_view_names_the_exif_orientation(data, run):
    sideways_jpeg(data / "img" / "photo.jpg")
    stored_view = row("find the block", ["img/photo.jpg"], answer=box_answer([300, 10, 390, 100]))
    path = write_lines(data / "train.jsonl", [*good_lines(), line(stored_view)])
    issue = only_issue(run([path], max_invalid_fraction=0.5, task="detection"), path, "E_BOX")
    assert "EXIF orientation 6" in issue.message and "upright view, 200x400" in issue.message


def test_upright_jpeg_is_copied_as_it_is(data, run):
    sideways_jpeg(data / "img" / "photo.jpg", orientation=1)
    path = write_lines(data / "train.jsonl", [*good_lines(), line(row("q", ["img/photo.jpg"]))])
    result = run([path])
    assert result.counts["n_exif_rotated"] == 0 and (400, 200) in result.stats["image_sizes"]
    copies = [p for d in (run.train, run.eval) for p in (d / "images").iterdir() if p.suffix == ".jpg"]
    assert [p.read_bytes() for p in copies] == [(data / "img" / "photo.jpg").read_bytes()]


def test_demo_data_with_three_eval_rows_on_train_images(tmp_path):
    """The issue's demonstration, small: the demo drawings with 3 eval rows re-using train images."""
    from pipelines.demo.drawings import generate_dataset

    demo = generate_dataset(tmp_path / "demo", n_train=8, n_eval=6, image_size=128)
    folder = tmp_path / "demo"
    (folder / "images" / "scan_0042.png").write_bytes((folder / "images" / "train_00003.png").read_bytes())
    rows = [json.loads(x) for x in Path(demo["eval"]).read_text(encoding="utf-8").splitlines()]
    rows[1]["images"] = ["images/train_00005.png"]  # the same image and prompt
    rows[3]["images"] = ["images/scan_0042.png"]  # a byte copy under another name
    rows[4]["images"] = ["images/train_00001.png"]
    rows[4]["messages"][0]["content"] = "<image>List every hole with its box."  # another prompt
    write_lines(Path(demo["eval"]), [line(r) for r in rows])
    out = tmp_path / "out"
    result = core.validate_data(
        [demo["train"]], str(out / "train"), str(out / "eval"), str(out / "quarantine.jsonl"),
        eval_files=[demo["eval"]], task="detection", report_out=str(out / "report.html"),
    )  # fmt: skip
    assert (result.counts["n_leaked"], result.counts["E_LEAK"], result.counts["n_eval"]) == (3, 3, 3)
    assert [(i.line, i.code) for i in result.issues] == [(2, "E_LEAK"), (4, "E_LEAK"), (5, "E_LEAK")]
    assert [k["train"] for k in result.stats["leaks"]] == [[f"{demo['train']}:{n}"] for n in (6, 4, 2)]
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "3 eval row(s) share an image" in html and "images/scan_0042.png (in train: images/train_00003.png)" in html
