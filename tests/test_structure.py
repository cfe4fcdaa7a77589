# SPDX-License-Identifier: Apache-2.0
"""The house rules of the package, checked on its source (no privileges needed).

- no import circles between the package's modules (imports inside
  functions count: a lazy import still ties two modules together);
- no module imports another module's private (_underscore) names;
- C libraries are opened through ctypes in one module (dataplane/clib/libs.py);
- the launcher (control/launcher) imports nothing of control/training, above it;
- no module over 450 lines, no function over 80 lines;
- every folder of Python code is a package (so the wheel cannot miss it);
- no two modules share a name (a file's name says what it holds, wherever
  it is read: a traceback, a grep, a doc that names the file);
- the BPF C sources (bpf/*.c, bpf/*.h) under the same size rules: no file
  over 450 lines, no function over 80 (c_functions finds them);
- every LTP_* environment variable is a settings-table entry, named through
  the table: no module but control/settings_table.py spells one, none has
  the old prefix (OLD_PREFIX), and none reads one while importing (a forked rank gets its
  environment after the fork server's imports: control/launcher/forkserver.py);
- docs/ARCHITECTURE.md's package table has a row for every module (__init__.py
  files aside) and every bpf/ file.
"""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("dataplane", "control", "tools")
C_SOURCES = sorted([*(ROOT / "bpf").glob("*.c"), *(ROOT / "bpf").glob("*.h")])
MAX_FILE_LINES, MAX_FUNC_LINES = 450, 80


def _modules() -> dict[str, Path]:
    """ltpx module name -> file, for the package's own code."""
    out = {"ltpx": ROOT / "__init__.py", "ltpx.errors": ROOT / "errors.py"}
    for part in PARTS:
        for p in (ROOT / part).rglob("*.py"):
            rel = p.relative_to(ROOT).with_suffix("").parts
            name = ".".join(("ltpx",) + (rel[:-1] if rel[-1] == "__init__" else rel))
            out[name] = p
    return out


MODULES = _modules()


def _package_of(name: str) -> str:
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]


def _imports(name: str) -> list[tuple[str, list[str], int]]:
    """(imported ltpx module, names taken from it, line) for every import in `name`."""
    tree = ast.parse(MODULES[name].read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(name).split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("ltpx"):
                continue
            names = [a.name for a in node.names]
            # `from pkg import module` imports the module itself
            for n in names:
                if f"{target}.{n}" in MODULES:
                    out.append((f"{target}.{n}", [], node.lineno))
            out.append((target, [n for n in names if f"{target}.{n}" not in MODULES],
                        node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("ltpx")]
    return [(t, n, line) for t, n, line in out if t in MODULES and t != name]


@pytest.mark.unit
def test_no_import_circles():
    graph = {m: {t for t, _, _ in _imports(m) if t != "ltpx"} for m in MODULES}
    circles, state = [], {}

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                circles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                visit(t, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


@pytest.mark.unit
def test_no_private_cross_imports():
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line} takes {n} from {t}"
           for m in MODULES for t, names, line in _imports(m)
           for n in names if n.startswith("_") and not n.startswith("__")]
    assert not bad, "\n".join(bad)


@pytest.mark.unit
def test_the_launcher_sits_below_training():
    """control/launcher imports nothing of control/training, lazily or not,
    nor names one of its modules for another process to import (the fork
    server's preload: `ltp train` passes its own): docs/ARCHITECTURE.md, Layers."""
    up = "ltpx.control.training"
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line} imports {t}"
           for m in MODULES if m.startswith("ltpx.control.launcher")
           for t, _, line in _imports(m) if t == up or t.startswith(up + ".")]
    bad += [f"{MODULES[m].relative_to(ROOT)} names {up}" for m in MODULES
            if m.startswith("ltpx.control.launcher") and up in MODULES[m].read_text()]
    assert not bad, "\n".join(bad)


@pytest.mark.unit
def test_ctypes_libraries_bound_once():
    users = sorted(str(p.relative_to(ROOT)) for p in MODULES.values()
                   if "CDLL(" in p.read_text() or "cdll." in p.read_text())
    assert users == ["dataplane/clib/libs.py"], users


@pytest.mark.unit
@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_and_function_sizes(name):
    src = MODULES[name].read_text()
    lines = src.count("\n")
    assert lines <= MAX_FILE_LINES, f"{name}: {lines} lines"
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines, line {n.lineno})"
            for n in ast.walk(ast.parse(src))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > MAX_FUNC_LINES]
    assert not long, f"{name}: " + ", ".join(long)


@pytest.mark.unit
def test_every_code_folder_is_a_package():
    missing = sorted(str(d.relative_to(ROOT)) for part in PARTS
                     for d in [ROOT / part, *(ROOT / part).rglob("*")]
                     if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))
                     and not (d / "__init__.py").exists())
    assert not missing, f"folders with Python code but no __init__.py: {missing}"


@pytest.mark.unit
def test_no_two_modules_share_a_name():
    """No two of the package's modules (tests, __init__.py and __main__.py
    aside) share a file name: each name says what its module holds, so a
    name met in a traceback, a grep or a doc points at one file."""
    by_name: dict[str, list[str]] = {}
    for p in sorted(MODULES.values()):
        if p.name not in ("__init__.py", "__main__.py"):
            by_name.setdefault(p.name, []).append(str(p.relative_to(ROOT)))
    shared = {n: ps for n, ps in by_name.items() if len(ps) > 1}
    assert not shared, "modules sharing a name: " + "; ".join(
        f"{n}: {', '.join(ps)}" for n, ps in sorted(shared.items()))


@pytest.mark.unit
def test_no_class_forwards_attributes_with_getattr():
    """No class of the package answers for attributes it does not have with
    __getattr__ (what it offers is what it declares: a reader, a type
    checker and a traceback see it). A module's own __getattr__, which loads
    its public names on first use (PEP 562), is allowed."""
    bad = []
    for p in sorted(MODULES.values()):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ClassDef):
                bad += [f"{p.relative_to(ROOT)}:{f.lineno}: {node.name}.__getattr__"
                        for f in node.body if isinstance(f, ast.FunctionDef)
                        and f.name in ("__getattr__", "__getattribute__")]
    assert not bad, "\n".join(bad)


@pytest.mark.unit
def test_no_module_decides_by_its_callers_frames():
    """No code of the package reads its callers' frames (sys._getframe,
    inspect.currentframe or .stack): what a call does depends on what it is
    given, never on who called it (the backend tells DDP's bucket all-reduce
    from a blocking Python call by the call's own options)."""
    bad = []
    for p in sorted(MODULES.values()):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in (
                    "_getframe", "currentframe", "stack", "getouterframes") and \
                    isinstance(node.value, ast.Name) and node.value.id in ("sys", "inspect"):
                bad.append(f"{p.relative_to(ROOT)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not bad, "\n".join(bad)


def _package_docstring_names(init: Path) -> tuple[set[str], set[str]]:
    """(modules of the package at `init`, those its docstring names)."""
    mods = {p.stem for p in init.parent.glob("*.py") if p.name != "__init__.py"}
    if init.parent == ROOT:
        mods.discard("setup")        # the build script beside the package root, no module of it
    mods |= {p.name for p in init.parent.iterdir()
             if p.is_dir() and (p / "__init__.py").exists()}
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", doc))
    return mods, mods & words


@pytest.mark.unit
@pytest.mark.parametrize("init", sorted(str(p.relative_to(ROOT)) for n, p in MODULES.items()
                                        if p.name == "__init__.py"))
def test_package_docstring_lists_every_module_or_none(init):
    """A package docstring that lists its modules lists them all (a list that
    misses half of them misleads more than none)."""
    mods, named = _package_docstring_names(ROOT / init)
    if len(named) >= 3:
        assert named == mods, f"{init} names {sorted(named)} but not {sorted(mods - named)}"


ARCHITECTURE = ROOT / "docs" / "ARCHITECTURE.md"
_FOLDER_ROW = re.compile(r"\|\s*\*\*`([^`]+/)`\*\*")     # | **`control/torchapi/`** | its job |
_FILE_ROW = re.compile(r"\|\s*`([^`]+)`\s*\|")             # | `native.py` | what it holds |


def _package_table() -> set[str]:
    """The files ARCHITECTURE.md's "Package layout" table gives a row, as
    paths from the package root: a bold folder row (`ltpx/` is the root)
    starts a group, and each row under it names one of its files."""
    text = ARCHITECTURE.read_text().split("## Package layout", 1)[1].split("\n## ", 1)[0]
    folder, out = "", set()
    for line in text.splitlines():
        if m := _FOLDER_ROW.match(line):
            folder = "" if m.group(1) == "ltpx/" else m.group(1)
        elif m := _FILE_ROW.match(line):
            out.add(folder + m.group(1))
    return out


@pytest.mark.unit
def test_architecture_package_table_has_every_module():
    """docs/ARCHITECTURE.md's package table has a row for every module (its
    __init__.py files aside) and every bpf/ file, under its own folder, so
    the table cannot fall behind the code. A row for a file not (yet) here
    is no error: the check runs from the code to the table."""
    rows = _package_table()
    files = [p for p in MODULES.values() if p.name != "__init__.py"] + C_SOURCES
    missing = sorted(str(p.relative_to(ROOT)) for p in files
                     if str(p.relative_to(ROOT)) not in rows)
    assert not missing, "docs/ARCHITECTURE.md, Package layout: no row for " + ", ".join(missing)


# --- C ------------------------------------------------------------------------

_C_NAME = re.compile(r"\b(\w+)\s*\(")


def c_functions(text: str) -> list[tuple[str, int, int]]:
    """(name, first line, last line) of each function defined at the top level
    of a C file written as this code base writes it (kernel style): the
    signature starts at column 0 (continuation lines indented), the body's
    `{` stands alone at column 0 on the line after it, and the `}` alone at
    column 0 that closes it ends the function. The first line is the
    signature's, as Python's count starts at `def`."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line != "{":
            continue
        start = i - 1
        while start > 0 and lines[start][:1] in (" ", "\t"):
            start -= 1
        name = _C_NAME.search(" ".join(lines[start:i]))
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == "}")
        out.append((name.group(1) if name else "?", start + 1, end + 1))
    return out


@pytest.mark.unit
def test_c_functions_finds_every_function_of_the_sources():
    """The finder against the real files: it sees the entry points and the
    helpers, every body's closing brace is one it counted (so none is
    missed), and a function cut in two halves shows as two."""
    found = {name: (a, b) for p in C_SOURCES for name, a, b in c_functions(p.read_text())}
    assert {"ltp_xdp", "ltp_run", "ltp_parse", "on_data", "data_admit", "data_store",
            "on_ack", "clock_send", "cap_begin", "link_count", "path_pin", "loss_tc",
            "xdp_pass"} <= set(found)
    for p in C_SOURCES:
        text = p.read_text()
        closers = sum(1 for line in text.splitlines() if line == "}")
        assert len(c_functions(text)) == closers, p.name
    a, b = found["xdp_pass"]
    assert b - a + 1 == 4          # int xdp_pass(...) / { / return XDP_PASS; / }
    two = "static int f(int a,\n\t\tint b)\n{\n\treturn a;\n}\n\nint g(void)\n{\n\treturn 0;\n}\n"
    assert c_functions(two) == [("f", 1, 5), ("g", 7, 10)]


@pytest.mark.unit
@pytest.mark.parametrize("path", [p.name for p in C_SOURCES])
def test_c_file_and_function_sizes(path):
    text = (ROOT / "bpf" / path).read_text()
    lines = text.count("\n")
    assert lines <= MAX_FILE_LINES, f"bpf/{path}: {lines} lines"
    long = [f"{name} ({b - a + 1} lines, line {a})" for name, a, b in c_functions(text)
            if b - a + 1 > MAX_FUNC_LINES]
    assert not long, f"bpf/{path}: " + ", ".join(long)



# --- environment variables ------------------------------------------------------

SETTINGS_TABLE = ROOT / "control" / "settings_table.py"
OLD_PREFIX = "LTP" + "X_"    # the variables' old prefix, spelled so a grep for it misses this file
_LTP_NAME = re.compile(r"LTPX?_[A-Z0-9_]*")
# LTP_* literals that name no environment variable and no name of the BPF C
# sources either, each with its reason
NOT_VARIABLES = {
    ("dataplane/xdp/maps.py", "LTP_C_"),   # the prefix of enum ltp_counter's members
    # the dataplane floor imports nothing of control: it spells its one
    # variable, which test_settings_table checks against the table's entry
    ("dataplane/xdp/bpfcache.py", "LTP_CACHE_DIR"),
}


def _c_names() -> set[str]:
    """The LTP_* names of the BPF C sources (macros, enum members)."""
    return {n for p in C_SOURCES for n in re.findall(r"\bLTP_[A-Z0-9_]+\b", p.read_text())}


def _ltp_names(path: Path) -> list[tuple[int, str]]:
    """(line, name) of each string literal in `path` that is all an LTP_* name
    (or one of OLD_PREFIX), and of each keyword argument so named
    (dict(LTP_RANK=...))."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
            text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
        elif isinstance(node, ast.keyword) and node.arg:
            text = node.arg
        else:
            continue
        if _LTP_NAME.fullmatch(text):
            out.append((node.lineno, text))
    return out


@pytest.mark.unit
def test_ltp_variables_are_named_through_the_settings_table():
    """No module but control/settings_table.py spells an LTP_* variable: each
    is a table entry, read with settings_table.env (or Settings), set with
    to_env, named with TABLE[name].env. Names of the BPF C sources (read
    from bpf/*.h: LTP_HDR_LEN, ...) name no variable, and no variable has
    one of their names."""
    from ltpx.control.settings_table import TABLE
    c_names = _c_names()
    assert not c_names & {s.env for s in TABLE.values()}
    found, bad = set(), []
    for p in MODULES.values():
        rel = str(p.relative_to(ROOT))
        for line, text in _ltp_names(p) if p != SETTINGS_TABLE else ():
            if (rel, text) in NOT_VARIABLES:
                found.add((rel, text))
            elif text not in c_names:
                bad.append(f"{rel}:{line}: {text!r}")
    assert not bad, "LTP_* names outside control/settings_table.py (a table entry, named " \
        "through it: settings_table.env, to_env, TABLE[name].env):\n" + "\n".join(bad)
    assert found == NOT_VARIABLES, f"stale NOT_VARIABLES entries: {NOT_VARIABLES - found}"


@pytest.mark.unit
def test_no_variable_has_the_old_prefix():
    """One prefix, LTP_: OLD_PREFIX is in no module, doc or script."""
    texts = [*MODULES.values(), ROOT / "README.md", *(ROOT / "docs").rglob("*.md"),
             *(p for p in (ROOT / "scripts").rglob("*") if p.is_file())]
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in texts
           for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
           if OLD_PREFIX in line]
    assert not bad, f"{OLD_PREFIX} (the prefix is LTP_): " + ", ".join(bad)


def _is_main_block(node: ast.If) -> bool:
    """`if __name__ == "__main__":`"""
    t = node.test
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name)
            and t.left.id == "__name__")


class _ImportTime(ast.NodeVisitor):
    """The calls a module makes while it is imported: its top-level code,
    class bodies, decorators and default values; not function bodies, nor
    an `if __name__ == "__main__":` block."""

    def __init__(self):
        self.calls: list[ast.Call] = []

    def _signature(self, node):
        for d in (*getattr(node, "decorator_list", ()), *node.args.defaults,
                  *(d for d in node.args.kw_defaults if d is not None)):
            self.visit(d)

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _signature

    def visit_If(self, node):
        if _is_main_block(node):
            for n in node.orelse:
                self.visit(n)
        else:
            self.generic_visit(node)

    def visit_Call(self, node):
        self.calls.append(node)
        self.generic_visit(node)


def _reads_a_setting(call: ast.Call, names: set[str]) -> bool:
    """Whether `call` is settings_table.env(...) (or env(...) where `names`,
    the module's names imported from settings_table, has it)."""
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "env" and isinstance(f.value, ast.Name)
            and f.value.id == "settings_table") or (isinstance(f, ast.Name) and f.id in names)


@pytest.mark.unit
def test_no_module_reads_an_ltp_variable_while_importing():
    """settings_table.env runs after import: a rank forked from the fork
    server gets its own environment after the zygote's imports, so a value
    read while importing would be the zygote's (forkserver.IMPORT_TIME lists
    no LTP_ prefix)."""
    bad = []
    for p in MODULES.values():
        tree = ast.parse(p.read_text())
        env_names = {a.asname or a.name for n in ast.walk(tree)
                     if isinstance(n, ast.ImportFrom) and (n.module or "").endswith("settings_table")
                     for a in n.names if a.name == "env"}
        v = _ImportTime()
        v.visit(tree)
        bad += [f"{p.relative_to(ROOT)}:{c.lineno}" for c in v.calls
                if _reads_a_setting(c, env_names)]
    assert not bad, "LTP_* variables read while importing: " + ", ".join(bad)


def _licensed_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT).stdout
    return [f for f in out.split() if f.endswith((".py", ".sh", ".lua")) or f == ".ci/run"]


@pytest.mark.unit
@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs the git checkout (git ls-files)")
def test_every_source_file_says_its_licence():
    """Apache-2.0 outside bpf/ (bpf/ is checked by test_bpf_sources), on the
    first line or the one after a #! line."""
    bad = []
    for f in _licensed_files():
        head = (ROOT / f).read_text().splitlines()[:2]
        if not any(ln.endswith("SPDX-License-Identifier: Apache-2.0") for ln in head):
            bad.append(f)
    assert not bad, bad
