"""The server never changes its own environment at run time: settings are read once (gpubox.settings) and
passed explicitly, so one server's choices cannot leak into another in the same process or into tests."""

from __future__ import annotations

import ast

from .conftest import ROOT

PACKAGE_DIRS = ("server", "tools", "resources", "prompts")
WRITERS = {"setdefault", "update", "pop", "popitem", "clear", "__setitem__", "__delitem__"}
# Known writers, reported to their owners; the list may only shrink.
KNOWN: dict[str, str] = {
    # read by onnxruntime's native code once, at import, before any session option could say otherwise
    "tools/search/onnx_query.py": "ORT_DISABLE_TELEMETRY before onnxruntime is imported",
}


def _is_environ(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ"


def environ_writes(source: str) -> list[int]:
    """Line numbers where `source` changes os.environ (item assignment, del, mutating methods, putenv)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign | ast.AugAssign | ast.Delete):
            targets = list(node.targets) if isinstance(node, ast.Assign | ast.Delete) else [node.target]
        if any(isinstance(t, ast.Subscript) and _is_environ(t.value) for t in targets):
            lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if (node.func.attr in WRITERS and _is_environ(owner)) or node.func.attr in {"putenv", "unsetenv"}:
                lines.append(node.lineno)
    return lines


def test_the_environ_scanner_finds_each_kind_of_write() -> None:
    code = (
        "import os\nos.environ['A'] = '1'\ndel os.environ['A']\nos.environ.setdefault('B', '1')\n"
        "os.putenv('C', '1')\nx = os.environ.get('D')\n"
    )
    assert environ_writes(code) == [2, 3, 4, 5]


def test_no_package_module_writes_os_environ_at_run_time() -> None:
    offenders = {}
    for folder in PACKAGE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            lines = environ_writes(path.read_text(encoding="utf-8"))
            if lines:
                offenders[rel] = lines
    new = {k: v for k, v in offenders.items() if k not in KNOWN}
    assert not new, f"modules that change os.environ (take the value from Settings instead): {new}"


def test_the_settings_module_only_reads_the_environment() -> None:
    assert environ_writes((ROOT / "server" / "settings.py").read_text(encoding="utf-8")) == []
