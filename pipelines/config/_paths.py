"""Where the shipped configs are, how a config is named on the command line, and the demo sources."""

from __future__ import annotations

from pathlib import Path

from pipelines.config._errors import ConfigError

# The shipped configs: pipelines/configs/ in an installed package (setup.py copies them there),
# configs/ at the root of a checkout (or an editable install).
_PIPELINES = Path(__file__).resolve().parent.parent
_PACKAGED_CONFIGS = _PIPELINES / "configs"
CONFIG_DIR = _PACKAGED_CONFIGS if _PACKAGED_CONFIGS.is_dir() else _PIPELINES.parent / "configs"
DEFAULT_LOCAL_CONFIG = CONFIG_DIR / "local" / "tiny_cpu.yaml"

# Sources that `pipelines.run --local` builds on the fly instead of reading from disk.
DEMO_MODEL = "demo://tiny-qwen3-vl"
DEMO_DATA_TRAIN = "demo://drawings/train"
DEMO_DATA_EVAL = "demo://drawings/eval"
DEMO_DOCUMENTS_TRAIN = "demo://documents/train"
DEMO_DOCUMENTS_EVAL = "demo://documents/eval"
DEMO_DRAWINGS_REGRESSION = "demo://drawings/regression"  # eval.regression: general questions about other drawings


def shipped_configs() -> list[Path]:
    """The configs that come with the project (installed with it), sorted."""
    return sorted(CONFIG_DIR.glob("**/*.yaml"))


def resolve_config_path(name: str | Path) -> Path:
    """A config file by path, or by the name of a shipped config (`tiny_cpu`, `qwen3_vl_4b/lora_seed`).

    An existing file wins; otherwise `name` (with or without `.yaml`) is looked up under the
    shipped configs (`shipped_configs`), by relative path or by file name when that is unique.

    Raises:
        ConfigError: Neither a file nor a shipped config (the shipped names are listed).
    """
    path = Path(name)
    if path.exists() or path.is_symlink():  # anything on disk (a folder, a device) gets load_config's own message
        return path
    text = str(name)
    stem = text[: -len(".yaml")] if text.endswith(".yaml") else text
    shipped = shipped_configs()
    by_rel = {str(p.relative_to(CONFIG_DIR).with_suffix("")): p for p in shipped}
    rel = stem[len("configs/") :] if stem.startswith("configs/") else stem
    if rel in by_rel:
        return by_rel[rel]
    by_name = [p for p in shipped if p.stem == rel]
    if len(by_name) == 1:
        return by_name[0]
    if by_name:
        several = ", ".join(str(p.relative_to(CONFIG_DIR).with_suffix("")) for p in by_name)
        raise ConfigError(f"{name}: several shipped configs have that name ({several}); give the folder too")
    names = ", ".join(sorted(by_rel))
    raise ConfigError(f"{name}: config file not found, and no shipped config has that name (shipped: {names})")
