"""A search-space file's text: read, parsed as YAML (a key given twice is an error), and the error
that names the place in it where something is wrong (SpecError: the file, the key, the reason).
Names a file gives are checked here too: they go into filter strings, run names and folders."""

from __future__ import annotations

import re
from pathlib import Path

import yaml


class SpecError(ValueError):
    def __init__(self, path, key: str, reason: str):
        super().__init__(f"{path}: {key}: {reason}")
        self.path, self.key, self.reason = path, key, reason


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML where a key given twice in one mapping is an error, not "the last one wins"."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (list, dict, set)):
                raise yaml.constructor.ConstructorError(
                    None, None, "a key must be a name or a number, not a list or mapping", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def parse_yaml(text: str):
    """A file's YAML (UniqueKeyLoader), with what PyYAML lets through as other errors (nesting too
    deep for the recursion limit, an integer too long to convert) raised as YAML errors too."""
    try:
        return yaml.load(text, Loader=UniqueKeyLoader)
    except (RecursionError, ValueError) as e:
        raise yaml.YAMLError(
            "nested too deep" if isinstance(e, RecursionError) else str(e).splitlines()[0]
        ) from None


def read_spec(path: str | Path) -> str:
    """A spec file's text; SpecError where it is missing, a folder, unreadable or not UTF-8."""
    path = Path(path)
    if not path.exists():
        raise SpecError(path, "file", "no such file")
    try:
        return path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise SpecError(path, "file", "a folder, not a file") from None
    except UnicodeDecodeError as e:
        raise SpecError(path, "file", f"not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise SpecError(path, "file", e.strerror or str(e)) from None


def read_yaml(path: str | Path, text: str | None = None):
    """A YAML file's data (of `text`, read as that file), or a SpecError naming the file, the line and
    the parser's reason."""
    try:
        return parse_yaml(read_spec(Path(path)) if text is None else text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "file"
        raise SpecError(path, where, f"malformed YAML: {getattr(e, 'problem', None) or e}") from None


def yaml_number(value: float) -> str:
    """`value` as YAML 1.1 reads a float (a dot in the mantissa, a signed exponent): 1.25e-04, not 125e-6."""
    mantissa, exponent = f"{value:e}".split("e")
    mantissa = mantissa.rstrip("0")
    return f"{mantissa}0e{exponent}" if mantissa.endswith(".") else f"{mantissa}e{exponent}"


# Names that end up in MLflow filter strings, run names, Optuna study names and folder names.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def name_problem(text: str) -> str | None:
    if SAFE_NAME.fullmatch(text) and ".." not in text:
        return None
    return (
        f"{text!r} must be 1-100 letters, digits, '_', '-' or '.' (not '..'), starting with a letter or digit"
    )


def safe_name(value, path, key: str) -> str:
    """`value` if it can go into a filter string or a path unquoted; else SpecError."""
    problem = name_problem(str(value))
    if problem:
        raise SpecError(path, key, problem)
    return str(value)
