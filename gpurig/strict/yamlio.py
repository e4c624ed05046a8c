"""Loading users' YAML files with bounded work and strict meaning.

Every spec, inventory and vars file goes through ``load_yaml``:

- read by gpurig/strict/reader.py: only regular files (a FIFO would hang,
  /dev/zero never ends), at most ``MAX_BYTES`` (the size is in the message);
- a document whose aliases would expand it past ``MAX_NODES`` values and
  ``EXPANSION`` times its own size, or nest
  deeper than ``MAX_DEPTH``, is refused before anything walks it;
- a key given twice in one mapping is an error naming both lines (YAML's
  "last one wins" silently dropped a whole `variants:` block);
- integers longer than ``MAX_INT_DIGITS`` digits are refused;
- every failure is the caller's error class with one line: file, line, rule.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from gpurig.errors import GpurigError

# read_text and the caps are the reader's; named here too, as this module's callers have always found them
from gpurig.strict.reader import MAX_BYTES as MAX_BYTES
from gpurig.strict.reader import MAX_DEPTH as MAX_DEPTH
from gpurig.strict.reader import read_text as read_text
from gpurig.strict.validate import excerpt

# Aliases may repeat a subtree, but not blow the document up: the expanded
# document may hold at most MAX_NODES values or EXPANSION times its own nodes.
MAX_NODES = 100_000
EXPANSION = 10
MAX_INT_DIGITS = 18

if TYPE_CHECKING:
    # One class for mypy to check _Loader against; libyaml's CSafeLoader has SafeLoader's constructor methods.
    _Base = yaml.SafeLoader
else:
    _Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: str | Path, *, error: type[GpurigError], what: str = "file", fix_missing: str = "check the path",
              fix_large: str = "") -> Any:
    """Parse one YAML document from a user's file under the bounds above (None for an empty file)."""
    path = Path(path)
    return parse_yaml(read_text(path, error=error, what=what, fix_missing=fix_missing, fix_large=fix_large), path, error=error)


def parse_yaml(text: str, source: str | Path, *, error: type[GpurigError]) -> Any:
    loader = _Loader(text)
    try:
        _check_depth(text)  # before composing: libyaml's composer recurses in C and crashes past ~20,000 levels
        node = loader.get_single_node()
        if node is None:
            return None
        _check_graph(node)
        return loader.construct_document(node)
    except _Refused as err:
        raise error(f"{source}:{err.where}: {err.rule}", err.fix) from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        if "nesting depth" in str(err.problem):  # PyYAML >= 6.0.4 stops at its own depth limit before our event check sees level 65
            raise error(f"{source}:{_Refused(mark, '', '').where}: nested deeper than {MAX_DEPTH} levels", "flatten the structure") from None
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        what = err.problem or err.context or "malformed YAML"
        # libyaml's text can quote the file (a tag, a character): keep it short and on one line
        what = " ".join(what.split())
        what = what if len(what) <= 100 else what[:97] + "..."
        raise error(f"{source}:{where} malformed YAML: {what}", "fix the YAML syntax at that line") from None
    except yaml.YAMLError as err:
        raise error(f"{source}: malformed YAML: {str(err).splitlines()[0] if str(err) else type(err).__name__}", "fix the YAML syntax") from None
    except RecursionError:
        raise error(f"{source}: nested too deeply to read", f"use at most {MAX_DEPTH} levels") from None
    except (MemoryError, ValueError, OverflowError) as err:
        raise error(f"{source}: cannot be read safely ({type(err).__name__})", "simplify the file") from None
    finally:
        loader.dispose()


class _Refused(Exception):
    def __init__(self, mark, rule: str, fix: str) -> None:
        super().__init__(rule)
        self.where = f" line {mark.line + 1}" if mark is not None else ""
        self.rule = rule
        self.fix = fix


def _check_depth(text: str) -> None:
    """Refuse nesting past MAX_DEPTH from the event stream, which libyaml produces without recursing."""
    depth = 0
    for event in yaml.parse(text, Loader=_Base):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise _Refused(event.start_mark, f"nested deeper than {MAX_DEPTH} levels", "flatten the structure")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


def _check_graph(root: yaml.Node) -> None:
    """Refuse documents that nest too deep or whose aliases expand past MAX_NODES (linear: sizes memoised)."""
    size: dict[int, int] = {}
    # Iterative post-order walk: (node, depth, children_done)
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        if id(node) in size:
            continue
        if depth > MAX_DEPTH:
            raise _Refused(node.start_mark, f"nested deeper than {MAX_DEPTH} levels", "flatten the structure")
        children = _children(node)
        if done or not children:
            total = 1 + sum(size[id(c)] for c in children)
            if total > MAX_NODES and total > EXPANSION * len(size):
                limit = max(MAX_NODES, EXPANSION * len(size))
                raise _Refused(node.start_mark, f"aliases expand to more than {limit} values", "repeat less through anchors/aliases")
            size[id(node)] = total
            continue
        stack.append((node, depth, True))
        stack.extend((c, depth + 1, False) for c in children if id(c) not in size)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


class _Loader(_Base):
    """Safe loading, plus: duplicate keys are errors, huge integers are refused."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: the base constructor reports it
                if first is not None:
                    raise _Refused(
                        key_node.start_mark,
                        f"key {excerpt(key)} given twice (first at line {first.start_mark.line + 1})",
                        "keep one of them",
                    )
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        # hex, octal and binary count too: '0x' and 5,000 f's is as huge as 5,000 nines
        text = str(node.value).replace("_", "").lstrip("+-")
        body = text[2:] if text[:2].lower() in ("0x", "0o", "0b") else text
        digits = sum(ch.isalnum() for ch in body)
        if digits > MAX_INT_DIGITS:
            raise _Refused(node.start_mark, f"integer with {digits} digits is too large", f"use at most {MAX_INT_DIGITS} digits")
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
# types-PyYAML bounds a constructor's self to the loader classes, so a method SafeConstructor defines (and _Loader inherits) is refused.
_Loader.add_constructor("tag:yaml.org,2002:map", _Loader.construct_yaml_map)  # type: ignore[type-var]
