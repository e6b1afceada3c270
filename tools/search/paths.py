"""Path priors of the ranking stage: test, vendored, generated and example code (semble's patterns), and copies of
an API that a newer one supersedes (pydantic's `v1/` beside the package, zod's `v3/` beside `v4/`, `deprecated/`)."""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Iterable

# path parts that mark code a user rarely means: tests, vendored deps, generated code, examples, compat shims.
# Test files, test dirs and example/compat dirs are semble's patterns at 8d737ab (src/semble/ranking/penalties.py,
# MIT): test files named the way each language's test runner names them (bats-core's lib/test_functions.bash is
# the framework, not a test; C and C++ tests also by GoogleTest's own `foo_test.cc` and Chromium's `_unittest`,
# which semble's `.cpp`-only pattern misses), no 'benchmarks' or 'docs' folders; measured on semble's tune half
# (bench/results/search_semble_tune.md).
_TEST_FILE = re.compile(
    r"(?:^|/)(?:test_[^/]*\.py|[^/]*_test\.py|[^/]*_test\.go|[^/]*Tests?\.java|[^/]*Test\.php|[^/]*_spec\.rb"
    r"|[^/]*_test\.rb|[^/]*\.test\.[jt]sx?|[^/]*\.spec\.[jt]sx?|[^/]*Tests?\.kt|[^/]*Spec\.kt|[^/]*Tests?\.swift"
    r"|[^/]*Spec\.swift|[^/]*Tests?\.cs|test_[^/]*\.(?:c|cc|cpp|cxx)|[^/]*_(?:unit)?test\.(?:c|cc|cpp|cxx)"
    r"|[^/]*Spec\.scala|[^/]*Suite\.scala|[^/]*Test\.scala|[^/]*_spec\.lua|[^/]*_test\.lua|test_[^/]*\.lua"
    r"|test_helpers?[^/]*\.\w+)$"
)
_TEST_DIR = re.compile(r"(?:^|/)(?:tests?|__tests__|spec|testing)/")
# not `build/`: the walker skips build output beside a manifest, and what it keeps under that name is a package
# (commons-io's org/apache/commons/io/build, date-fns' scripts/build)
_VENDOR_DIR = re.compile(r"(?:^|/)(?:vendor|third_party|node_modules|dist|generated|_generated)/")
_GENERATED_FILE = re.compile(r"(?:\.min\.js|\.pb\.go|_pb2\.py|\.generated\.\w+|\.d\.ts)$")
_EXAMPLE_DIR = re.compile(r"(?:^|/)(?:_?examples?|docs?_src|compat|_compat|legacy)/")
_VERSION_DIR = re.compile(r"v(\d+)(?:(alpha|beta)(\d*))?")
_SUPERSEDED_NAMES = frozenset({"deprecated"})
# file names any folder may have: sharing them is no sign that `v1/` copies its parent
_BOILERPLATE = frozenset(
    {"__init__.py", "index.ts", "index.js", "index.tsx", "mod.rs", "lib.rs", "doc.go", "README.md", "package.json"}
)


@functools.lru_cache(maxsize=8192)
def path_penalty(path: str) -> bool:
    p = path.replace("\\", "/")
    return bool(
        _TEST_FILE.search(p) or _TEST_DIR.search(p) or _VENDOR_DIR.search(p) or _GENERATED_FILE.search(p)
        or _EXAMPLE_DIR.search(p)
    )  # fmt: skip


def superseded_dirs(paths: Iterable[str]) -> frozenset[str]:
    """Folders ("a/v1/") holding an API's older copy, read from every indexed path: a version folder beside a newer
    one (zod's src/v3 beside src/v4; Kubernetes' v1beta1 beside v1), a lone `v1/` repeating two or more of its
    parent's own file names (pydantic/v1/fields.py beside pydantic/fields.py; a Go module's `v2/`, Exposed's
    org/jetbrains/exposed/v1 or a web app's api/v1 are the current code), and any `deprecated/` folder."""
    versions: dict[str, dict[str, tuple[int, int, int]]] = defaultdict(dict)
    files: dict[str, set[str]] = defaultdict(set)
    out: set[str] = set()
    for path in paths:
        parts = path.replace("\\", "/").split("/")
        files["/".join(parts[:-1])].add(parts[-1])
        for i, part in enumerate(parts[:-1]):
            parent = "/".join(parts[:i])
            if (m := _VERSION_DIR.fullmatch(part)) is not None:
                stage = {"alpha": 0, "beta": 1}.get(m.group(2) or "", 2)
                versions[parent][part] = (int(m.group(1)), stage, int(m.group(3) or 0))
            elif part in _SUPERSEDED_NAMES:
                out.add(_join(parent, part))
    for parent, found in versions.items():
        newest = max(found.values())
        out.update(_join(parent, name) for name, key in found.items() if key < newest)
        if list(found) == ["v1"] and len((files[_join(parent, "v1").rstrip("/")] & files[parent]) - _BOILERPLATE) >= 2:
            out.add(_join(parent, "v1"))
    return frozenset(out)


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}/" if parent else f"{name}/"


def under(path: str, folders: frozenset[str]) -> str | None:
    """The folder of `folders` that holds `path`, if any."""
    p = path.replace("\\", "/")
    return next((f for f in folders if p.startswith(f)), None)
