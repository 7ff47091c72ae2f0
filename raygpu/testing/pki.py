"""Certificates and keys for the testbed, made with the ``openssl`` command.

One CA signs serving certificates for 127.0.0.1 (kube-apiserver, Kueue's
webhooks) and client certificates (the API server trusts it as its client CA:
a certificate's CN is the user, its O the groups); one RSA key signs and
verifies ServiceAccount tokens.

Secrets (private keys, the API server's token file, kubeconfigs holding a
token) are readable by their owner only (mode 0600) whatever the umask.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

PRIVATE_MODE = 0o600


def _run(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _private(key: Path) -> Path:
    """Make ``key`` (a private key openssl just wrote) owner-only; OpenSSL 3 does too, older ones need not."""
    key.chmod(PRIVATE_MODE)
    return key


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` with mode 0600, set before any byte is written, also when ``path`` existed
    with a wider mode (a testbed made by an older raygpu)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_MODE)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), PRIVATE_MODE)
        f.write(text)
    return path


def write_token_file(path: Path, token: str, user: str, groups: tuple[str, ...] = ()) -> Path:
    """The kube-apiserver ``--token-auth-file``: one line ``token,user,uid,"group,..."``, mode 0600.

    Raises ValueError for a field the CSV cannot hold (a comma, quote or newline in token or user).
    """
    for field in (token, user, *groups):
        if not field or any(c in field for c in ',"\n'):
            raise ValueError(f"token file field {field!r} must be non-empty, without commas, quotes or newlines")
    return write_private(path, f'{token},{user},{user},"{",".join(groups)}"\n')


def ensure_ca(d: Path) -> tuple[Path, Path]:
    d.mkdir(parents=True, exist_ok=True)
    crt, key = d / "ca.crt", d / "ca.key"
    if not crt.exists():
        _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", "/CN=raygpu-testbed-ca",
             "-keyout", str(key), "-out", str(crt))
        _private(key)
    return crt, key


def ensure_serving_cert(d: Path, name: str, ca: tuple[Path, Path], dns: list[str]) -> tuple[Path, Path]:
    """A cert for 127.0.0.1 and ``dns`` names, signed by ``ca``; files ``<name>.crt/.key``."""
    crt, key = d / f"{name}.crt", d / f"{name}.key"
    if crt.exists():
        return crt, key
    csr, ext = d / f"{name}.csr", d / f"{name}.ext"
    san = ",".join(["IP:127.0.0.1", "IP:10.0.0.1"] + [f"DNS:{n}" for n in dns])
    ext.write_text(f"subjectAltName={san}\nextendedKeyUsage=serverAuth\n")
    _run("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(csr))
    _private(key)
    _run("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
         "-days", "3650", "-extfile", str(ext), "-out", str(crt))
    return crt, key


def ensure_rsa_key(path: Path) -> Path:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _run("genrsa", "-out", str(path), "2048")
        _private(path)
    return path


def ensure_client_cert(d: Path, user: str, ca: tuple[Path, Path], groups: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """A client certificate for ``user`` (CN) in ``groups`` (O), signed by ``ca``; files ``client-<user>.crt/.key``."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in user)
    crt, key = d / f"client-{safe}.crt", d / f"client-{safe}.key"
    if crt.exists():
        return crt, key
    csr, ext = d / f"client-{safe}.csr", d / f"client-{safe}.ext"
    ext.write_text("extendedKeyUsage=clientAuth\n")
    subj = f"/CN={user}" + "".join(f"/O={g}" for g in groups)
    _run("req", "-newkey", "rsa:2048", "-nodes", "-subj", subj, "-keyout", str(key), "-out", str(csr))
    _private(key)
    _run("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
         "-days", "3650", "-extfile", str(ext), "-out", str(crt))
    return crt, key
