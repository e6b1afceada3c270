"""Build-output folders are skipped where a build writes them (beside a manifest), and kept as source elsewhere."""

from __future__ import annotations

from pathlib import Path

from gpubox.tools.search.walker import WalkOptions, walk


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_output_folders_beside_a_manifest_are_skipped_and_packages_of_that_name_are_kept(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "package.json": "{}",
            "dist/index.js": "export const built = 1;\n",
            "coverage/lcov.js": "var x = 1;\n",
            "packages/p/Cargo.toml": "[package]\n",
            "packages/p/target/debug/gen.rs": "fn gen() {}\n",
            "packages/p/src/lib.rs": "pub fn lib() {}\n",
            # a Java package and a folder of build scripts named like outputs: source, no manifest beside them
            "src/main/java/org/x/build/Builder.java": "class Builder {}\n",
            "scripts/build/cts.ts": "export function createCTSFiles() {}\n",
            "scripts/tsconfig.json": "{}",  # type-checks the scripts: no build writes beside it
            "src/out/render.go": "package out\n",
        },
    )
    result = walk(root, WalkOptions())
    paths = {p for p, _ in result.files}
    assert {"src/main/java/org/x/build/Builder.java", "scripts/build/cts.ts", "src/out/render.go"} <= paths
    assert "packages/p/src/lib.rs" in paths
    assert not {p for p in paths if p.startswith(("dist/", "coverage/", "packages/p/target/"))}
    assert result.excluded["build output (dist)"] == 1
    assert result.excluded["build output (coverage)"] == 1
    assert result.excluded["build output (target)"] == 1


def test_a_csproj_or_gemspec_marks_a_project_folder_too(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "App/App.csproj": "<Project/>",
            "App/out/App.cs": "class Gen {}\n",
            "gem/x.gemspec": "",
            "gem/build/x.rb": "class Gen; end\n",
        },
    )
    result = walk(root, WalkOptions())
    assert not [p for p, _ in result.files if p.startswith(("App/out/", "gem/build/"))]
    assert result.excluded["build output (out)"] == 1 and result.excluded["build output (build)"] == 1


def test_dotnet_and_xcode_outputs_and_a_scripts_bin_folder(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "Lib/Lib.csproj": "<Project/>",
            "Lib/obj/Debug/Lib.AssemblyInfo.cs": "class Gen {}\n",
            "Lib/bin/Debug/Lib.cs": "class Gen {}\n",
            "Lib/Api.cs": "class Api {}\n",
            "App/App.xcodeproj/project.pbxproj": "",
            "App/build/Gen.swift": "struct Gen {}\n",
            "App/Main.swift": "struct Main {}\n",
            "tools/bin/release.sh": "echo release\n",  # scripts, not .NET output
            "mill/build.mill": "",
            "mill/out/gen.scala": "object Gen\n",
        },
    )
    result = walk(root, WalkOptions())
    paths = {p for p, _ in result.files}
    assert {"Lib/Api.cs", "App/Main.swift", "tools/bin/release.sh"} <= paths
    assert not {p for p in paths if p.startswith(("Lib/obj/", "Lib/bin/", "App/build/", "mill/out/"))}
    assert result.excluded["build output (obj)"] == 1 and result.excluded["build output (bin)"] == 1


def test_a_gn_tree_keeps_its_build_folder_and_skips_out(tmp_path: Path) -> None:
    # Chromium-style: build/ holds build configs and scripts (source); GN writes to out/
    root = _tree(
        tmp_path,
        {".gn": "", "BUILD.gn": "", "build/gn_helpers.py": "def helper(): ...\n", "out/Default/gen/a.h": "int a;\n"},
    )
    result = walk(root, WalkOptions())
    assert [p for p, _ in result.files if p.startswith(("build/", "out/"))] == ["build/gn_helpers.py"]
    assert result.excluded["build output (out)"] == 1
