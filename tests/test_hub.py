"""``--model org/name[@revision]``: Hub ids resolve through a Hub cache built here in the Hub's
on-disk layout (blobs, snapshots of symlinks, refs); nothing is downloaded (``HF_HUB_OFFLINE=1``,
and the one network path is a stub)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import quicksilver
from quicksilver import hub
from quicksilver.errors import ConfigError
from quicksilver.hub import CHECKPOINT_FILES, resolve_model

MAIN = "a" * 40  # commit of refs/main
V1 = "b" * 40  # commit of refs/v1 (a branch)


def add_snapshot(
    cache: Path, repo_id: str, commit: str, files: dict[str, bytes], refs: tuple[str, ...] = ()
) -> Path:
    """``files`` as ``commit`` of ``repo_id`` in the Hub cache layout; ``refs`` point at it."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    for ref in refs:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture
def cache(tmp_path: Path, tiny_ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Hub cache holding org/tiny (main, v1) and org/broken (no weights), offline."""
    root = tmp_path / "hf-cache"
    files = {f.name: f.read_bytes() for f in tiny_ckpt.iterdir() if f.is_file()}
    add_snapshot(root, "org/tiny", MAIN, files, refs=("main",))
    add_snapshot(root, "org/tiny", V1, files, refs=("v1",))
    no_weights = {k: v for k, v in files.items() if not k.endswith(".safetensors")}
    add_snapshot(root, "org/broken", MAIN, no_weights, refs=("main",))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return root


def snap(cache: Path, repo_id: str, commit: str) -> Path:
    return cache / ("models--" + repo_id.replace("/", "--")) / "snapshots" / commit


def test_hub_ids_resolve_from_the_cache(cache: Path) -> None:
    assert resolve_model("org/tiny") == snap(cache, "org/tiny", MAIN)
    assert resolve_model("org/tiny@v1") == snap(cache, "org/tiny", V1)  # a branch ref
    assert resolve_model("org/tiny", revision="v1") == snap(cache, "org/tiny", V1)
    assert resolve_model(f"org/tiny@{V1}") == snap(cache, "org/tiny", V1)  # a commit
    assert resolve_model("org/tiny@v1", revision="v1") == snap(cache, "org/tiny", V1)
    path = resolve_model("org/tiny")
    assert resolve_model(path, revision="v1") == path  # a directory is a directory
    assert hub.hub_cache_dir() == cache


def test_local_paths_win(tiny_ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_model(tiny_ckpt) == tiny_ckpt
    assert resolve_model(str(tiny_ckpt)) == tiny_ckpt
    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "tiny").symlink_to(tiny_ckpt)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("org/tiny") == Path("org/tiny")  # a relative directory, not the Hub id
    missing = tmp_path / "nowhere" / "ckpt"
    assert resolve_model(missing) == missing  # no Hub id: the loader reports the directory
    assert resolve_model("ckpt") == Path("ckpt")


@pytest.mark.parametrize(
    ("name", "revision", "says"),
    [
        ("org/tiny@v1", "main", "--revision says 'main'"),
        ("org/tiny@", None, "empty revision"),
        ("org/ti ny@v1", None, "neither a local directory nor a Hub id"),
        ("a/b/c", "main", "neither a local directory nor a Hub id"),
        ("org/nothere", None, "not in the Hub cache"),
        ("runs/typo", None, "no directory 'runs/typo' here, and as a Hub id: runs/typo: not in"),
        ("org/tiny@v9", None, "not in the Hub cache"),
        ("org/broken", None, "incomplete (missing model.safetensors)"),
    ],
)
def test_errors_are_one_line(
    cache: Path, monkeypatch: pytest.MonkeyPatch, name: str, revision: str | None, says: str
) -> None:
    calls: list[dict[str, Any]] = []
    real = hub_snapshot_download()

    def spy(*a: Any, **kw: Any) -> str:
        calls.append(kw)
        return str(real(*a, **kw))

    monkeypatch.setattr("huggingface_hub.snapshot_download", spy)
    with pytest.raises(ConfigError) as e:
        resolve_model(name, revision)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert all(kw["local_files_only"] for kw in calls)  # offline: never the network


def hub_snapshot_download() -> Any:
    import huggingface_hub

    return huggingface_hub.snapshot_download


def not_found(cls: type[Exception]) -> Exception:
    """The Hub's 404 error as huggingface_hub raises it (from 1.0 on it needs the HTTP response,
    of the client its ``errors`` module is built on)."""
    msg = "404 Client Error: Repository Not Found for url"
    try:
        return cls(msg)
    except TypeError:
        import sys

        from huggingface_hub import errors

        http = sys.modules[errors.Response.__module__.split(".")[0]]  # type: ignore[attr-defined]
        request = http.Request("GET", "https://huggingface.co/api/models/org/gone")
        return cls(msg, response=errors.Response(404, request=request))  # type: ignore[attr-defined]


def test_the_network_only_where_allowed(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Online, a cache miss downloads the checkpoint's files (stubbed: no request leaves) and a
    cached, complete snapshot is used without a request."""
    from huggingface_hub.errors import RepositoryNotFoundError

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    real = hub_snapshot_download()
    asked: list[dict[str, Any]] = []

    def online(repo_id: str, **kw: Any) -> str:
        if kw.get("local_files_only"):
            return str(real(repo_id, **kw))
        asked.append({"repo_id": repo_id, **kw})
        if repo_id == "org/gone":
            raise not_found(RepositoryNotFoundError)
        files = {"config.json": snap(cache, "org/tiny", MAIN).joinpath("config.json").read_bytes()}
        files["model.safetensors"] = (
            snap(cache, "org/tiny", MAIN) / "model.safetensors"
        ).read_bytes()
        return str(add_snapshot(Path(kw["cache_dir"]), repo_id, "c" * 40, files, refs=("main",)))

    monkeypatch.setattr("huggingface_hub.snapshot_download", online)
    assert resolve_model("org/tiny") == snap(cache, "org/tiny", MAIN) and not asked
    assert resolve_model("org/new") == snap(cache, "org/new", "c" * 40)
    (kw,) = asked
    assert kw["cache_dir"] == str(cache) and kw["revision"] is None
    patterns = kw["allow_patterns"]
    assert patterns == list(CHECKPOINT_FILES) and "*.bin" not in patterns
    assert {"config.json", "*.safetensors", "tokenizer.json", "chat_template.jinja"} <= set(
        patterns
    )
    with pytest.raises(ConfigError, match="org/gone: no such model on the Hub"):
        resolve_model("org/gone")


def test_load_by_hub_id_generates(cache: Path) -> None:
    pipe = quicksilver.load("org/tiny")
    assert pipe.path == snap(cache, "org/tiny", MAIN)
    res = pipe.generate("hi", chat=False, max_new_tokens=4, steps=4, policy="low_confidence")
    assert 0 < len(res.tokens) <= 4
    assert quicksilver.load("org/tiny", revision="v1").path == snap(cache, "org/tiny", V1)
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE"):
        quicksilver.load("org/nothere@v2")


def test_served_name_is_the_hub_id(cache: Path) -> None:
    from quicksilver.server.config import ServerConfig
    from quicksilver.server.served import served_name

    assert served_name(ServerConfig(model="org/tiny@v1")) == "org/tiny"
    assert served_name(ServerConfig(model="org/tiny", revision=MAIN)) == "org/tiny"
    assert served_name(ServerConfig(model="org/tiny", served_model_name="x")) == "x"


def test_cli_generate_by_hub_id(cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the monkeypatched HF_* variables included
    r = subprocess.run(
        [sys.executable, "-m", "quicksilver.cli", "generate", "hi", "--model", "org/tiny",
         "--revision", "v1", "--json", "--raw", "--max-tokens", "4", "--steps", "4",
         "--policy", "low_confidence"],
        capture_output=True, text=True, timeout=180, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout.strip().splitlines()[-1])["tokens"]) <= 4

    from quicksilver.cli import main

    for argv in (
        ["generate", "hi", "--model", "org/nothere"],
        ["generate", "hi", "--model", "org/tiny@v1", "--revision", "main"],
        ["generate", "hi", "--model", "org/broken"],
        ["info", "org/nothere"],
        ["generate", "hi", "--revision", "v1"],  # a revision of the embedded model
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("quicksilver: error: ") and err.count("\n") == 1, err
    assert main(["info", "org/tiny@v1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == str(snap(cache, "org/tiny", V1))


def test_every_model_flag_has_a_revision() -> None:
    from quicksilver.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    parsers = [sub["generate"], sub["serve"], sub["eval"], sub["info"]]
    parsers += [sub["export"]._actions[-1].choices["gguf"]]
    parsers += list(sub["bench"]._actions[-1].choices.values())
    for p in parsers:
        flags = {s for a in p._actions for s in a.option_strings}
        if "--model" in flags or p is sub["info"]:
            assert "--revision" in flags, p.prog
