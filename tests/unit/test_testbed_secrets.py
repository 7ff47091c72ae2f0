"""The testbed's secrets are owner-only (issue 14 item c): the API server's token file, the kubeconfigs that
hold a token and the private keys are written with mode 0600 whatever the umask. Nothing is started."""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest

from raygpu.testing import pki
from raygpu.testing import controlplane
from raygpu.testing.controlplane import ADMIN_TOKEN


@pytest.fixture
def open_umask():
    """umask 0: without an explicit mode every file would be world-readable."""
    old = os.umask(0)
    yield
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_token_file_is_owner_only(tmp_path, open_umask):
    path = pki.write_token_file(tmp_path / "pki" / "tokens.csv", ADMIN_TOKEN, "admin", ("system:masters",))
    assert mode(path) == 0o600
    assert path.read_text() == f'{ADMIN_TOKEN},admin,admin,"system:masters"\n'


def test_a_token_file_left_world_readable_is_closed(tmp_path, open_umask):
    path = tmp_path / "tokens.csv"
    path.write_text("old-token,admin,admin,\n")
    path.chmod(0o644)
    pki.write_token_file(path, "new-token", "admin")
    assert mode(path) == 0o600 and path.read_text() == 'new-token,admin,admin,""\n'


@pytest.mark.parametrize("token,user,groups", [("a,b", "admin", ()), ("t", 'ad"min', ()), ("t", "admin", ("g\n",)),
                                               ("", "admin", ())])
def test_token_file_fields_that_the_csv_cannot_hold_are_refused(tmp_path, token, user, groups):
    with pytest.raises(ValueError, match="token file field"):
        pki.write_token_file(tmp_path / "tokens.csv", token, user, groups)
    assert not (tmp_path / "tokens.csv").exists()


def test_kubeconfig_with_a_token_is_owner_only(tmp_path, open_umask):
    (tmp_path / "state.json").write_text(json.dumps({"ports": {"apiserver": 6443}}))
    path = controlplane.Testbed(tmp_path).kubeconfig_for_token("sa-token", "sa", tmp_path / "sa.kubeconfig")
    assert mode(path) == 0o600 and "sa-token" in path.read_text()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_private_keys_are_owner_only(tmp_path, open_umask):
    ca = pki.ensure_ca(tmp_path)
    keys = [ca[1], pki.ensure_rsa_key(tmp_path / "sa.key"),
            pki.ensure_serving_cert(tmp_path, "apiserver", ca, ["localhost"])[1]]
    assert {k.name: mode(k) for k in keys} == {k.name: 0o600 for k in keys}
    assert mode(ca[0]) & 0o044  # certificates stay readable: the mode is set on secrets only
