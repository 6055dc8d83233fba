"""A search-space file's text: read, parsed as YAML (a key given twice is an error), and the error
that names the place in it where something is wrong (SpecError: the file, the key, the reason).
Names a file gives are checked here too: they go into filter strings, run names and folders."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import yaml

SHOWN_CHARS = 600  # of a reason: one that quotes a large value keeps its start and its end


class SpecError(ValueError):
    def __init__(self, path, key: str, reason: str):
        if len(reason) > SHOWN_CHARS:
            reason = f"{reason[: SHOWN_CHARS - 200]} ... {reason[-200:]}"
        super().__init__(f"{path}: {key}: {reason}")
        self.path, self.key, self.reason = path, key, reason


MAX_BYTES = 1 << 20  # 400 times the largest shipped file; PyYAML reads about 100 KB a second
MAX_VALUES = 1_000_000  # values a document's aliases may expand to (a billion laughs expands to 10^9)
MAX_INT = 2**63 - 1  # no value of a file is larger: past a float's range, one broke the plan's arithmetic


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML where a key given twice in one mapping is an error, not "the last one wins"; a merge
    key (`<<: *defaults`) gives the keys the mapping does not give itself, as YAML defines it."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
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

    def construct_yaml_int(self, node):
        value = super().construct_yaml_int(node)
        if abs(value) > MAX_INT:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"{node.value[:20]}... is past a 64-bit integer, which no value takes",
                node.start_mark,
            )
        return value

    def construct_object(self, node, deep=False):
        """A value its tag does not fit (`!!bool name`, `!!timestamp x`, an integer past Python's digit
        limit), as a YAML error with its line: PyYAML's constructors raise KeyError, AttributeError or
        ValueError for these."""
        try:
            return super().construct_object(node, deep)
        except (KeyError, AttributeError, TypeError, ValueError):
            what = repr(node.value)[:80] if isinstance(node, yaml.ScalarNode) else f"a {node.id}"
            raise yaml.constructor.ConstructorError(
                None, None, f"{what} cannot be read as {node.tag}", node.start_mark
            ) from None


UniqueKeyLoader.add_constructor("tag:yaml.org,2002:int", UniqueKeyLoader.construct_yaml_int)


def expanded_size(node, sizes: dict) -> int:
    """How many values `node` stands for with its aliases expanded (each node worked out once, in `sizes`)."""
    if id(node) not in sizes:
        sizes[id(node)] = 1  # a node that holds itself counts once
        if isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = node.value if isinstance(node, yaml.SequenceNode) else []
        sizes[id(node)] = 1 + sum(expanded_size(child, sizes) for child in children)
    return sizes[id(node)]


def parse_yaml(text: str):
    """A file's YAML (UniqueKeyLoader), with what PyYAML lets through as other errors (nesting too
    deep for the recursion limit, a tag its value does not fit) raised as YAML errors too, and
    aliases that expand past MAX_VALUES refused before anything walks them."""
    loader = UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None and expanded_size(node, {}) > MAX_VALUES:
            raise yaml.YAMLError(f"its aliases expand to more than {MAX_VALUES:,} values")
        return None if node is None else loader.construct_document(node)
    except (RecursionError, ValueError, KeyError, AttributeError, TypeError) as e:  # past construct_object
        raise yaml.YAMLError(
            "nested too deep" if isinstance(e, RecursionError) else (str(e).splitlines() or [repr(e)])[0]
        ) from None
    finally:
        loader.dispose()


def read_spec(path: str | Path) -> str:
    """A spec file's text; SpecError where it is missing, not a regular file (a folder, a FIFO, a
    device: reading one blocks or never ends), larger than MAX_BYTES, unreadable or not UTF-8."""
    path = Path(path)
    try:
        found = path.stat()
    except FileNotFoundError:
        raise SpecError(path, "file", "no such file") from None
    except (OSError, ValueError) as e:  # ValueError: a NUL in the name
        raise SpecError(path, "file", getattr(e, "strerror", None) or str(e)) from None
    if stat.S_ISDIR(found.st_mode):
        raise SpecError(path, "file", "a folder, not a file")
    if not stat.S_ISREG(found.st_mode):
        raise SpecError(path, "file", "not a regular file (a FIFO, a socket or a device)")
    if found.st_size > MAX_BYTES:
        raise SpecError(path, "file", f"{found.st_size:,} bytes; a file read here is at most {MAX_BYTES:,}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(path, "file", f"not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise SpecError(path, "file", e.strerror or str(e)) from None


def read_yaml(path: str | Path, text: str | None = None):
    """A YAML file's data (of `text`, read as that file), or a SpecError naming the file, the line and
    the parser's reason."""
    text = read_spec(Path(path)) if text is None else text
    try:
        return parse_yaml(text)
    except yaml.reader.ReaderError as e:  # its text spans lines; the character and its place say it
        where = f"line {text.count(chr(10), 0, e.position) + 1}"
        raise SpecError(path, where, f"malformed YAML: character #x{e.character:04x}: {e.reason}") from None
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
