"""Certificates and keys for the testbed, made with the ``openssl`` command.

One CA signs serving certificates for 127.0.0.1 (kube-apiserver, Kueue's
webhooks) and client certificates (the API server trusts it as its client CA:
a certificate's CN is the user, its O the groups); one RSA key signs and
verifies ServiceAccount tokens.
"""

from __future__ import annotations

import subprocess
from pathlib import Path


def _run(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def ensure_ca(d: Path) -> tuple[Path, Path]:
    d.mkdir(parents=True, exist_ok=True)
    crt, key = d / "ca.crt", d / "ca.key"
    if not crt.exists():
        _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", "/CN=raygpu-testbed-ca",
             "-keyout", str(key), "-out", str(crt))
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
    _run("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
         "-days", "3650", "-extfile", str(ext), "-out", str(crt))
    return crt, key


def ensure_rsa_key(path: Path) -> Path:
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _run("genrsa", "-out", str(path), "2048")
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
    _run("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
         "-days", "3650", "-extfile", str(ext), "-out", str(crt))
    return crt, key
