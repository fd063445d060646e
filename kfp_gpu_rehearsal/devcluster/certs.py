"""Self-signed PKI for the local control plane, generated with ``openssl``.

Everything lives in ``<cluster dir>/pki`` and is generated once (re-used on
later boots).  Files:

* ``ca.crt/ca.key``           cluster CA (client + serving certs)
* ``apiserver.crt/.key``      kube-apiserver serving cert (127.0.0.1, kubernetes.default...)
* ``admin.crt/.key``          client cert ``CN=kfp-gpu-admin, O=system:masters``
* ``front-proxy-client.*``   aggregation-layer client cert (keeps requestheader auth configured)
* ``sa.key/sa.pub``           service-account token signing key pair
* ``webhook-ca.crt/.key``     Training Operator webhook CA (SAN ``training-operator-ca``)
* ``webhook.crt/.key``        Training Operator webhook serving cert
                              (SAN ``training-operator.kubeflow.svc`` and 127.0.0.1)
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

DAYS = "3650"
WEBHOOK_DNS = "training-operator.kubeflow.svc"  # <service>.<namespace>.svc as the cert rotator expects
WEBHOOK_CA_NAME = "training-operator-ca"  # cert-controller verifies the CA against this DNS name


class CertError(RuntimeError):
    pass


def _openssl(*args: str) -> None:
    if shutil.which("openssl") is None:
        raise CertError("'openssl' is not on PATH; it is needed to create the dev-cluster certificates")
    proc = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise CertError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


def _key(path: Path, pkcs1: bool = False) -> None:
    tmp = path.with_name(path.name + ".pkcs8")
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(tmp))
    if pkcs1:  # "BEGIN RSA PRIVATE KEY": cert-controller parses the CA key with x509.ParsePKCS1PrivateKey
        _openssl("pkey", "-in", str(tmp), "-traditional", "-out", str(path))
        tmp.unlink()
    else:
        tmp.rename(path)
    path.chmod(0o600)


def _ca(d: Path, name: str, cn: str, san: str | None = None, pkcs1: bool = False) -> None:
    crt, key = d / f"{name}.crt", d / f"{name}.key"
    if crt.exists() and key.exists() and (not pkcs1 or b"RSA PRIVATE KEY" in key.read_bytes()):
        return
    _key(key, pkcs1)
    args = ["req", "-x509", "-new", "-key", str(key), "-days", DAYS, "-subj", f"/CN={cn}", "-out", str(crt)]
    args += ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"]
    if san:
        args += ["-addext", f"subjectAltName={san}"]
    _openssl(*args)


def _leaf(d: Path, name: str, ca: str, subj: str, eku: str, san: str | None = None, pkcs1: bool = False) -> None:
    crt, key = d / f"{name}.crt", d / f"{name}.key"
    if crt.exists() and key.exists() and crt.stat().st_mtime >= (d / f"{ca}.crt").stat().st_mtime:
        return
    _key(key, pkcs1)
    with tempfile.TemporaryDirectory() as tmp:
        csr, ext = Path(tmp) / "req.csr", Path(tmp) / "ext.cnf"
        _openssl("req", "-new", "-key", str(key), "-subj", subj, "-out", str(csr))
        lines = ["basicConstraints=critical,CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
                 f"extendedKeyUsage={eku}"]
        if san:
            lines.append(f"subjectAltName={san}")
        ext.write_text("\n".join(lines) + "\n")
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(d / f"{ca}.crt"), "-CAkey", str(d / f"{ca}.key"),
                 "-CAcreateserial", "-days", DAYS, "-extfile", str(ext), "-out", str(crt))


def ensure_pki(d: Path) -> Path:
    """Create any missing key material under ``d``; return ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    _ca(d, "ca", "kfp-gpu-dev-ca")
    api_san = ",".join([
        "IP:127.0.0.1", "IP:10.96.0.1", "DNS:localhost", "DNS:kubernetes", "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local",
    ])
    _leaf(d, "apiserver", "ca", "/CN=kube-apiserver", "serverAuth", api_san)
    _leaf(d, "admin", "ca", "/O=system:masters/CN=kfp-gpu-admin", "clientAuth")
    _leaf(d, "front-proxy-client", "ca", "/CN=front-proxy-client", "clientAuth")
    if not (d / "sa.key").exists() or not (d / "sa.pub").exists():
        _key(d / "sa.key")
        _openssl("pkey", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub"))
    _ca(d, "webhook-ca", WEBHOOK_CA_NAME, f"DNS:{WEBHOOK_CA_NAME}", pkcs1=True)
    _leaf(d, "webhook", "webhook-ca", f"/CN={WEBHOOK_DNS}", "serverAuth", f"DNS:{WEBHOOK_DNS},IP:127.0.0.1",
          pkcs1=True)
    return d
