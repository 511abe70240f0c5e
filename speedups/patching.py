"""Replacing a library's symbol once, telling whether a symbol is still ours, and putting the originals back.

Every item declares what it patches (`registry.Target`). Before an item's code runs, `remember` keeps what each of
its targets holds (the first time only: the library's own object); `restore` puts those back. The plugin restores
an item whose installation raised (no half-installed item keeps running), and tests restore everything between
tests (`restore()` with no item), so that no test sees another's patches.
"""

from __future__ import annotations

import fnmatch
import importlib
import sys
from collections.abc import Callable
from typing import Any

from speedups.records import Item, Target

MISSING = object()
# (id(owner), attribute) -> (owner, attribute, what the owner held itself before any item ran: MISSING if nothing),
# and the items that touched it
_ORIGINALS: dict[tuple[int, str], tuple[Any, str, Any]] = {}
_BY_ITEM: dict[int, set[tuple[int, str]]] = {}


def _owners(target: Target, load: bool) -> list[tuple[Any, str]]:
    """(owner, attribute name) for each place `target` names that exists now (`load`: import the module)."""
    if target.scope == "instances":
        return []
    if any(c in target.module for c in "*?["):
        modules = loaded_modules(target.module)
    elif target.module in sys.modules and sys.modules[target.module] is not None:
        modules = [sys.modules[target.module]]
    elif load and target.scope == "module":
        try:
            modules = [importlib.import_module(target.module)]
        except Exception:  # noqa: BLE001 - a module that does not import has nothing to keep
            modules = []
    else:
        modules = []
    *path, name = target.attribute.split(".")
    out = []
    for owner in modules:
        for part in path:
            owner = getattr(owner, part, None)
            if owner is None:
                break
        if owner is not None and (path or hasattr(owner, name)):
            out.append((owner, name))
    return out


def remember(item: Item, load: bool = True) -> None:
    """Keeps what the item's targets hold now, where nothing was kept for them yet."""
    for target in item.patches:
        for owner, name in _owners(target, load):
            key = (id(owner), name)
            if key not in _ORIGINALS:
                _ORIGINALS[key] = (
                    owner,
                    name,
                    vars(owner).get(name, MISSING) if hasattr(owner, "__dict__") else MISSING,
                )
            _BY_ITEM.setdefault(item.number, set()).add(key)


def remember_attribute(owner: Any, name: str) -> None:
    """Keeps what `owner.<name>` holds now (the plugin's own wrappers outside any item: `Trainer.__init__`)."""
    key = (id(owner), name)
    if key not in _ORIGINALS:
        _ORIGINALS[key] = (owner, name, vars(owner).get(name, MISSING))


def restore(item: Item | None = None) -> int:
    """Puts back what `remember` kept, for one item or for all; how many symbols changed back."""
    keys = list(_ORIGINALS) if item is None else list(_BY_ITEM.get(item.number, ()))
    changed = 0
    for key in keys:
        entry = _ORIGINALS.get(key)
        if entry is None:
            continue
        owner, name, value = entry
        current = vars(owner).get(name, MISSING)
        if current is value:
            continue
        if value is MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, value)
        changed += 1
    if item is None:
        _ORIGINALS.clear()
        _BY_ITEM.clear()
    return changed


def ours(value: Any) -> bool:
    """Whether `value` is one of the plugin's wrappers, or wraps one (`__wrapped__` chains, staticmethods)."""
    seen = 0
    while value is not None and seen < 20:
        value = getattr(value, "__func__", value)
        if any(k.startswith("_vlm_lora") and v for k, v in getattr(value, "__dict__", {}).items()):
            return True
        value = getattr(value, "__wrapped__", None)
        seen += 1
    return False


def not_ours(item: Item) -> list[str]:
    """The item's module-scope targets that exist but do not hold the plugin's wrapper (replaced after it)."""
    found = []
    for target in item.patches:
        if target.scope != "module" or any(c in target.module for c in "*?["):
            continue
        owners = _owners(target, load=False)
        if not owners or not all(ours(getattr(owner, name, None)) for owner, name in owners):
            found.append(str(target))
    return found


def wrap_once(owner: Any, name: str, wrap: Callable[[Any], Any], marker: str) -> bool:
    """Replaces `owner.<name>` by `wrap(original)` unless already wrapped (`marker` set); False if absent."""
    original = getattr(owner, name, None)
    if original is None:
        return False
    if not getattr(original, marker, False):
        setattr(owner, name, wrap(original))
    return True


def loaded_modules(pattern: str) -> list[Any]:
    """The loaded modules whose name matches `pattern` (a Target's module)."""
    return [m for name, m in list(sys.modules.items()) if m is not None and fnmatch.fnmatchcase(name, pattern)]
