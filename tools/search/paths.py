"""Path priors of the ranking stage: test, vendored, generated and example code (semble's patterns), and copies of
an API that a newer one supersedes (pydantic's `v1/` beside the package, zod's `v3/` beside `v4/`, `deprecated/`)."""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Iterable

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
_VENDOR_DIR = re.compile(r"(?:^|/)(?:vendor|third_party|node_modules|dist|build|generated|_generated)/")
_GENERATED_FILE = re.compile(r"(?:\.min\.js|\.pb\.go|_pb2\.py|\.generated\.\w+|\.d\.ts)$")
_EXAMPLE_DIR = re.compile(r"(?:^|/)(?:_?examples?|docs?_src|compat|_compat|legacy)/")
_VERSION_DIR = re.compile(r"v(\d+)")
_SUPERSEDED_NAMES = frozenset({"deprecated"})


@functools.lru_cache(maxsize=8192)
def path_penalty(path: str) -> bool:
    p = path.replace("\\", "/")
    return bool(
        _TEST_FILE.search(p) or _TEST_DIR.search(p) or _VENDOR_DIR.search(p) or _GENERATED_FILE.search(p)
        or _EXAMPLE_DIR.search(p)
    )  # fmt: skip


def superseded_dirs(paths: Iterable[str]) -> frozenset[str]:
    """Folders ("a/v1/") holding an API's older copy, read from every indexed path: `vN/` beside a `vM/` with M > N
    (zod's src/v3 beside src/v4), a lone `vN/` in a folder whose own files are the current code (pydantic/v1 beside
    pydantic/main.py; Exposed's org/jetbrains/exposed/v1, alone in a folder of no files, is the current API), and
    any `deprecated/` folder."""
    versions: dict[str, set[int]] = defaultdict(set)
    has_files: set[str] = set()
    out: set[str] = set()
    for path in paths:
        parts = path.replace("\\", "/").split("/")
        has_files.add("/".join(parts[:-1]))
        for i, part in enumerate(parts[:-1]):
            parent = "/".join(parts[:i])
            if (m := _VERSION_DIR.fullmatch(part)) is not None:
                versions[parent].add(int(m.group(1)))
            elif part in _SUPERSEDED_NAMES:
                out.add(_join(parent, part))
    for parent, found in versions.items():
        newest = max(found)
        out.update(_join(parent, f"v{n}") for n in found if n < newest)
        if len(found) == 1 and parent in has_files:
            out.add(_join(parent, f"v{newest}"))
    return frozenset(out)


def _join(parent: str, name: str) -> str:
    return f"{parent}/{name}/" if parent else f"{name}/"


def under(path: str, folders: frozenset[str]) -> str | None:
    """The folder of `folders` that holds `path`, if any."""
    p = path.replace("\\", "/")
    return next((f for f in folders if p.startswith(f)), None)
