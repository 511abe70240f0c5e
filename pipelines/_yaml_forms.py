"""Plain YAML scalars that YAML 1.1 (PyYAML) and YAML 1.2 read differently: refused by name.

PyYAML implements YAML 1.1: `lora_rank: 017` loads as 15 (octal), `1:30` as 90 (base 60),
`1_000` as 1000, `yes` / `no` / `on` / `off` as booleans; YAML 1.2 (and most other tools)
reads them as 17, text, text and text. `0o17` is octal in 1.2 and text in 1.1; `0x1F` and
`0b101` are numbers in one and not everywhere in the other. A config means one value, so
each form is refused with its line and the unambiguous spelling. Quoted scalars are text in
both and pass; mapping keys are checked by the schema.
"""

from __future__ import annotations

import re

import yaml

_FORMS: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"[-+]?0[0-9_]+"),
        "a number with a leading zero (YAML 1.1 reads 017 as octal 15, YAML 1.2 as 17): write it without the "
        "leading zero, or quote it as text",
    ),
    (re.compile(r"[-+]?0o[0-7_]+"), "an octal number 0o... (text in YAML 1.1): write the decimal number"),
    (re.compile(r"[-+]?0x[0-9a-fA-F_]+"), "a hexadecimal number 0x...: write the decimal number"),
    (re.compile(r"[-+]?0b[01_]+"), "a binary number 0b... (text in YAML 1.2): write the decimal number"),
    (
        re.compile(r"[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?"),
        "a base-60 number (YAML 1.1 reads 1:30 as 90, YAML 1.2 as text): write the number, or quote it as text",
    ),
    (
        re.compile(r"[-+]?[0-9][0-9]*(_[0-9]*)+(\.[0-9_]*)?([eE][-+]?[0-9]+)?|[-+]?[0-9]*\.[0-9]*_[0-9_]*"),
        "a number with '_' separators (YAML 1.1 reads 1_000 as 1000, YAML 1.2 as text): write 1000",
    ),
    (
        re.compile(r"yes|no|on|off", re.IGNORECASE),
        "a YAML 1.1 boolean (yes / no / on / off; text in YAML 1.2): write true or false, or quote it as text",
    ),
)


def scalar_problem(node: yaml.ScalarNode) -> str | None:
    """What is ambiguous about a plain scalar, or None (quoted scalars and explicit tags are never ambiguous)."""
    if node.style is not None or node.tag not in (
        "tag:yaml.org,2002:int",
        "tag:yaml.org,2002:float",
        "tag:yaml.org,2002:bool",
        "tag:yaml.org,2002:str",
    ):
        return None
    if node.tag == "tag:yaml.org,2002:str" and not any(c.isdigit() for c in node.value):
        if node.value.lower() not in ("yes", "no", "on", "off"):
            return None
    for pattern, problem in _FORMS:
        if pattern.fullmatch(node.value):
            return problem
    return None


def ambiguous_form(node: yaml.Node | None) -> tuple[int, str, str, str] | None:
    """The first value in a composed YAML tree whose meaning differs between YAML 1.1 and 1.2.

    The walk is iterative (a deep tree cannot exhaust Python's stack) and visits each node once.

    Returns:
        (line, dotted key, the value as written, what is ambiguous and the fix), or None.
    """
    stack: list[tuple[yaml.Node, str]] = [(node, "")] if node is not None else []
    seen: set[int] = set()
    while stack:
        current, key = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, yaml.ScalarNode):
            problem = scalar_problem(current)
            if problem:
                return current.start_mark.line + 1, key, current.value, problem
        elif isinstance(current, yaml.SequenceNode):
            stack.extend((child, key) for child in reversed(current.value))
        elif isinstance(current, yaml.MappingNode):
            for k, v in reversed(current.value):
                name = k.value if isinstance(k, yaml.ScalarNode) else "?"
                stack.append((v, f"{key}.{name}" if key else name))
    return None
