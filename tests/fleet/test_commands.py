"""The fleet verbs as a user runs them: keygen, sign, verify, push, versions, promote (a real
SeaweedFS for the store); a refusal is one error line with a fix and no traceback."""

from __future__ import annotations

import json
import shutil
import stat

import pytest

from edgekit.cli import main
from edgekit.fleet.keys import read_public_key
from edgekit.fleet.signature import SIGNATURE


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def test_keygen_sign_verify(tmp_path, bundles, capsys):
    bundle = shutil.copytree(bundles["v1"], tmp_path / "b")
    code, out, _ = run(capsys, "keygen", "--out", str(tmp_path / "keys"))
    assert code == 0 and "edgekit.key" in out and "key id" in out
    assert stat.S_IMODE((tmp_path / "keys" / "edgekit.key").stat().st_mode) == 0o600
    code, _, err = run(capsys, "keygen", "--out", str(tmp_path / "keys"))
    assert code == 2 and "not overwriting a key" in err and "fix:" in err
    pub = str(tmp_path / "keys" / "edgekit.pub")
    code, _, err = run(capsys, "verify", str(bundle), "--trusted-key", pub)
    assert code == 2 and "is not signed" in err and "edgekit sign" in err
    code, out, _ = run(capsys, "sign", str(bundle), "--key", str(tmp_path / "keys" / "edgekit.key"))
    assert code == 0 and SIGNATURE in out
    code, out, _ = run(capsys, "verify", str(bundle), "--trusted-key", pub, "--json")
    assert code == 0 and json.loads(out)["ok"] is True
    (bundle / "labels.txt").write_text("x\n")
    code, _, err = run(capsys, "verify", str(bundle), "--trusted-key", pub)
    assert code == 2 and "does not match its sha256" in err


def test_push_versions_promote(fleet, bundles, capsys, tmp_path):
    key = str(fleet.keys["trusted"][0])
    first, second = (shutil.copytree(bundles[v], tmp_path / v) for v in ("v1", "v2"))
    with fleet.admin():
        code, out, _ = run(capsys, "push", str(first), fleet.dest, "--channel", "stable", "--key", key)
        assert code == 0 and "channel stable ->" in out and (first / SIGNATURE).is_file()
        v1 = json.loads(run(capsys, "push", str(first), fleet.dest, "--key", key, "--json")[1])
        assert v1["sent"] == 0 and v1["channel"] is None  # the same bytes are not sent twice
        v2 = json.loads(run(capsys, "push", str(second), fleet.dest, "--channel", "canary", "--key", key,
                            "--json")[1])
        code, out, _ = run(capsys, "versions", fleet.dest)
        assert code == 0 and out.count("\n") == 3
        lines = {line.split()[0]: line for line in out.splitlines()[1:]}
        assert lines[v1["version"][:12]].endswith("stable") and lines[v2["version"][:12]].endswith("canary")
        code, out, _ = run(capsys, "promote", v2["version"][:8], fleet.dest, "--channel", "stable",
                           "--trusted-key", fleet.pub())
        assert code == 0 and f"{v1['version'][:12]} -> {v2['version'][:12]}" in out
        listed = json.loads(run(capsys, "versions", fleet.dest, "--json")[1])
        assert listed["channels"] == {"stable": v2["version"], "canary": v2["version"]}
        code, _, err = run(capsys, "promote", v1["version"][:8], fleet.dest, "--channel", "stable",
                           "--trusted-key", fleet.pub("stranger"))
        assert code == 2 and "not trusted" in err
        code, _, err = run(capsys, "promote", "abcdef", fleet.dest, "--channel", "stable")
        assert code == 2 and "no versions" in err


def test_push_signs_again_with_the_key_it_is_given(fleet, bundles, capsys, tmp_path):
    bundle = shutil.copytree(bundles["v1"], tmp_path / "b")
    with fleet.admin():
        run(capsys, "push", str(bundle), fleet.dest, "--channel", "stable", "--key", str(fleet.keys["trusted"][0]))
        code, out, _ = run(capsys, "push", str(bundle), fleet.dest, "--channel", "stable", "--key",
                           str(fleet.keys["stranger"][0]))
    trusted_id = read_public_key(fleet.pub()).key_id
    assert code == 0 and out.startswith(f"signed {bundle} with key") and f"(it was signed by key {trusted_id})" in out
    code, _, err = run(capsys, "verify", str(bundle), "--trusted-key", fleet.pub())
    assert code == 2 and "not trusted" in err


@pytest.mark.parametrize("argv, words", [
    (["push", "{bundle}", "https://cdn.example.com/x", "--key", "{key}"], "read-only"),
    (["push", "{bundle}", "s3://models/x", "--channel", "no/slash", "--key", "{key}"], "not a channel name"),
    (["push", "{rejected}", "s3://models/x", "--key", "{key}"], "failed its accuracy check"),
    (["versions", "s3://Bad_Bucket/x"], "not an S3 bucket name"),
])
def test_push_refusals_are_one_line(fleet, bundles, capsys, tmp_path, argv, words):
    from tests.runtime.test_adapters import write_bundle

    rejected = write_bundle(tmp_path / "rejected", {"fp32": next(bundles["v1"].glob("*.tflite"))},
                            verification={"passed": False, "reason": "top-1 0.41 < 0.9"})
    bundle = shutil.copytree(bundles["v1"], tmp_path / "b")
    values = {"bundle": str(bundle), "key": str(fleet.keys["trusted"][0]), "rejected": str(rejected)}
    with fleet.admin():
        code, _, err = run(capsys, *(a.format(**values) for a in argv))
    assert code == 2 and words in err and err.count("error:") == 1


def test_a_store_that_cannot_be_reached_is_exit_1(fleet, bundles, capsys, tmp_path, monkeypatch):
    bundle = shutil.copytree(bundles["v1"], tmp_path / "b")
    with fleet.admin():
        proxy = fleet.proxy()
        proxy.set_down(True)
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
        code, _, err = run(capsys, "push", str(bundle), fleet.dest, "--channel", "stable", "--key",
                           str(fleet.keys["trusted"][0]))
    assert code == 1 and "error:" in err and "AWS_ENDPOINT_URL" in err
