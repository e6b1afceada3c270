from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpubox.errors import InvalidInputError, NotFoundError, PathNotAllowedError
from gpubox.paths import check_tree_inside, open_inside, resolve_inside


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """An allowed root with a file, and a directory outside it with a secret."""
    root = tmp_path / "root"
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("print('hi')\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s3cret\n")
    return root, outside


def test_a_nul_byte_is_an_input_error_not_a_crash(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    with pytest.raises(InvalidInputError, match="NUL"):
        resolve_inside("src/main.py\x00.txt", [root])


def test_relative_paths_resolve_against_the_allowed_root_not_the_working_directory(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, outside = tree
    monkeypatch.chdir(outside)
    assert resolve_inside("src/main.py", [root]) == (root / "src" / "main.py").resolve()
    with pytest.raises(NotFoundError):
        resolve_inside("secret.txt", [root])  # exists in the working directory, not in the root


def test_a_relative_path_with_several_roots_asks_for_an_absolute_path(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    with pytest.raises(InvalidInputError, match="absolute path"):
        resolve_inside("src/main.py", [root, outside])
    assert resolve_inside(str(root / "src"), [root, outside]) == (root / "src").resolve()


def test_errors_for_outside_paths_do_not_reveal_whether_they_exist(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    with pytest.raises(PathNotAllowedError) as present:
        resolve_inside(str(outside / "secret.txt"), [root])
    with pytest.raises(PathNotAllowedError) as absent:
        resolve_inside(str(outside / "nothing.txt"), [root])
    assert str(present.value).replace("secret", "X") == str(absent.value).replace("nothing", "X")


def test_a_symlink_pointing_outside_is_refused_without_naming_its_target(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    (root / "link.txt").symlink_to(outside / "secret.txt")
    with pytest.raises(PathNotAllowedError) as err:
        resolve_inside("link.txt", [root])
    assert str(outside) not in str(err.value) and "secret" not in str(err.value)
    with pytest.raises(PathNotAllowedError):
        open_inside("link.txt", [root])


def test_dot_dot_cannot_climb_out_of_the_root(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    with pytest.raises(PathNotAllowedError):
        resolve_inside("src/../../outside/secret.txt", [root])


def test_open_inside_reads_a_regular_file_inside_the_root(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    with open_inside("src/main.py", [root]) as fh:
        assert fh.read() == b"print('hi')\n"


def test_open_inside_refuses_directories_and_fifos(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    with pytest.raises(InvalidInputError, match="regular file"):
        open_inside("src", [root])
    os.mkfifo(root / "pipe")
    with pytest.raises(InvalidInputError, match="regular file"):
        open_inside("pipe", [root])  # must not block waiting for a writer


def test_open_inside_catches_a_directory_swapped_for_a_symlink_after_the_check(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, outside = tree
    (outside / "main.py").write_text("stolen\n")
    import gpubox.paths as paths

    real = paths.resolve_inside

    def check_then_swap(*args: object, **kwargs: object) -> Path:
        checked = real(*args, **kwargs)  # type: ignore[arg-type]
        # the race: after the check, src/ becomes a link to a directory outside the root
        (root / "src" / "main.py").unlink()
        (root / "src").rmdir()
        (root / "src").symlink_to(outside)
        return checked

    monkeypatch.setattr(paths, "resolve_inside", check_then_swap)
    with pytest.raises(PathNotAllowedError) as err:
        open_inside("src/main.py", [root])
    assert str(outside) not in str(err.value)


def test_a_name_over_255_bytes_is_an_input_error_naming_the_limit(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    for given in ("a" * 300, "src/" + "a" * 300, str(root / ("é" * 200))):  # 400 bytes in UTF-8
        with pytest.raises(InvalidInputError, match="at most 255 bytes"):
            resolve_inside(given, [root], what="dataset")
    with pytest.raises(InvalidInputError, match="longer than 4096 bytes"):
        resolve_inside("/".join(["a" * 200] * 30), [root])


def test_a_symlink_whose_target_name_is_too_long_is_an_input_error(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    (root / "long").symlink_to("b" * 300)  # resolving works, stat fails with ENAMETOOLONG
    with pytest.raises((InvalidInputError, NotFoundError)):
        resolve_inside("long", [root])


def test_a_folder_is_checked_entry_by_entry(tree: tuple[Path, Path]) -> None:
    root, outside = tree
    folder = root / "src"
    check_tree_inside(folder, [root])
    (folder / "state.json").symlink_to(outside / "secret.txt")
    with pytest.raises(PathNotAllowedError, match=r"'state\.json' is a symlink") as err:
        check_tree_inside(folder, [root], what="dataset folder")
    assert "dataset folder" in str(err.value) and str(outside) not in str(err.value)
    (folder / "state.json").unlink()
    (folder / "inner").symlink_to(root / "elsewhere", target_is_directory=True)  # a link that stays inside
    (root / "elsewhere").mkdir()
    check_tree_inside(folder, [root])
    (root / "elsewhere" / "x.arrow").symlink_to(outside / "secret.txt")  # reached through the inside link
    with pytest.raises(PathNotAllowedError, match=r"'inner/x\.arrow'"):
        check_tree_inside(folder, [root])


def test_a_folder_with_a_link_loop_a_fifo_or_too_many_entries_is_refused(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = tree
    folder = root / "src"
    (folder / "loop").symlink_to(folder / "loop")
    with pytest.raises(PathNotAllowedError, match="'loop'"):
        check_tree_inside(folder, [root])
    (folder / "loop").unlink()
    (folder / "up").symlink_to(folder, target_is_directory=True)  # a cycle that stays inside: walked once
    check_tree_inside(folder, [root])
    os.mkfifo(folder / "pipe")
    with pytest.raises(InvalidInputError, match="'pipe' is not a regular file"):
        check_tree_inside(folder, [root])
    (folder / "pipe").unlink()
    import gpubox.paths as paths

    monkeypatch.setattr(paths, "TREE_MAX_ENTRIES", 2)
    (folder / "a").write_text("")
    (folder / "b").write_text("")
    with pytest.raises(InvalidInputError, match="more than 2 files"):
        check_tree_inside(folder, [root])


@pytest.mark.anyio
@pytest.mark.requires_search  # without the extra, search_index says so before it looks at the path
@pytest.mark.requires_models
async def test_search_index_with_an_overlong_name_says_what_is_wrong(tmp_path: Path) -> None:
    from mcp import Client

    from gpubox.app import build_server, state_of
    from gpubox.settings import Settings
    from tests.conftest import call_err

    (tmp_path / "root").mkdir()
    mcp = build_server(Settings.load(state_dir=tmp_path / "state", allowed_roots=[tmp_path / "root"]))
    try:
        async with Client(mcp) as client:
            text = await call_err(client, "search_index", path="a" * 300, dry_run=True)
    finally:
        state_of(mcp).close()
    assert "300 bytes" in text and "255" in text
