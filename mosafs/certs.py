"""Certificates for mutual TLS between mosafs processes (docs/operations.md).

A cluster has its own certificate authority. Every process presents a certificate the CA
signed; the certificate says what the process is (its *role*) in the subject's
organizational unit, and who it is in the common name:

    role        who                                   may call (mosafs/rpc/access.py)
    manager     the metadata server                   benefactors' maintenance RPCs
    benefactor  a storage daemon                      the manager's registry RPCs, peers' puts
    client      a mount (FUSE client)                 the file system and chunk RPCs
    admin       an administrator (`mosafs` commands)  everything a client may, and the admin
                                                      RPCs: pools, policies, drain, gc, scrub

Server certificates (manager, benefactor) carry the DNS name `mosafs` (SERVER_NAME), which
every channel asks for (gRPC's ssl_target_name_override): addresses change with every start
(port 0, containers), identity comes from the CA's signature and the role.

Files in a TLS directory: `ca.crt`, `ca.key` (keep it where certificates are issued only),
and `NAME.crt`/`NAME.key` per process; keys are written with mode 0600. Keys are ECDSA
P-256; certificates are valid 10 years (CA) and 2 years (the others).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from mosafs.capability import CAPABILITY_OID, FULL, Capability
from mosafs.errors import AlreadyExists, ConfigError, NotFound

ROLES = ("manager", "benefactor", "client", "admin")
SERVER_ROLES = ("manager", "benefactor")
SERVER_NAME = "mosafs"
CA_DAYS = 3650
CERT_DAYS = 730
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True)
class Identity:
    """What a process presents and trusts: PEM bytes of the CA, its certificate and key."""

    ca: bytes
    cert: bytes
    key: bytes
    role: str
    name: str
    directory: Path | None = None  # the TLS directory it was loaded from (revocations)


def check_name(name: str) -> str:
    if not name or len(name) > 64 or not set(name) <= _NAME_CHARS:
        raise ConfigError(f"bad certificate name {name[:80]!r}: use 1..64 characters of "
                          f"A-Z a-z 0-9 . _ -")
    return name


def _key():  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, data: bytes, *, secret: bool) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _pem_key(key) -> bytes:  # type: ignore[no-untyped-def]
    from cryptography.hazmat.primitives import serialization

    return bytes(key.private_bytes(serialization.Encoding.PEM,
                                   serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption()))


def init_ca(directory: Path, *, name: str = "mosafs cluster CA") -> Path:
    """A new CA in DIRECTORY (made if missing); AlreadyExists if there is one."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "ca.crt").exists():
        raise AlreadyExists(f"{directory} holds a CA already (ca.crt): issue certificates "
                            f"with it, or choose another directory")
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mosafs"),
                         x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    _write(directory / "ca.key", _pem_key(key), secret=True)
    _write(directory / "ca.crt", cert.public_bytes(serialization.Encoding.PEM), secret=False)
    return directory / "ca.crt"


def issue(directory: Path, name: str, role: str, *, hosts: tuple[str, ...] = (),
          overwrite: bool = False, capability: Capability | None = None) -> Path:
    """NAME.crt/NAME.key for ROLE, signed by the CA in DIRECTORY. HOSTS (names or IP
    addresses) are added to a server certificate's subject alternative names. CAPABILITY
    (clients only; None: full access) goes into the certificate (mosafs.capability)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    check_name(name)
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}: use one of {', '.join(ROLES)}")
    if name == "ca":
        raise ConfigError("'ca' names the certificate authority itself")
    if capability is not None and role != "client":
        raise ConfigError(f"only client certificates carry a capability (this one is "
                          f"{role}: it has the access of its role)")
    if (directory / f"{name}.crt").exists() and not overwrite:
        raise AlreadyExists(f"{directory / (name + '.crt')} exists")
    ca_cert, ca_key = _load_ca(directory)
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "mosafs"),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                         x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH,
                                                     ExtendedKeyUsageOID.SERVER_AUTH]),
                              critical=False))
    if role in SERVER_ROLES or hosts:
        names: list[x509.GeneralName] = [x509.DNSName(SERVER_NAME)] if role in SERVER_ROLES \
            else []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    if capability is not None and not capability.full:
        builder = builder.add_extension(x509.UnrecognizedExtension(
            x509.ObjectIdentifier(CAPABILITY_OID), capability.to_json()), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write(directory / f"{name}.key", _pem_key(key), secret=True)
    _write(directory / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM),
           secret=False)
    return directory / f"{name}.crt"


def _load_ca(directory: Path):  # type: ignore[no-untyped-def]
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
        key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    except FileNotFoundError as exc:
        raise NotFound(f"no CA in {directory} ({exc.filename} is missing): run "
                       f"`mosafs certs init --dir {directory}` first") from None
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"the CA in {directory} cannot be read: {exc}") from None
    return cert, key


def role_of(cert_pem: bytes) -> tuple[str, str]:
    """(role, name) a certificate states (ConfigError if it states none)."""
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise ConfigError(f"not a PEM certificate: {exc}") from None
    units = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    role = str(units[0].value) if units else ""
    if role not in ROLES:
        raise ConfigError(f"certificate states no mosafs role (OU {role!r})")
    return role, str(names[0].value) if names else ""


@dataclass(frozen=True)
class PeerCertificate:
    """What the servers need of a caller's certificate (parsed once per certificate)."""

    role: str
    name: str
    capability: Capability
    fingerprint: bytes  # SHA-256 of the DER encoding: what revocation lists name


def peer_certificate(cert_pem: bytes) -> PeerCertificate:
    """Role, name, capability and fingerprint of a PEM certificate (ConfigError if it
    states no role or carries a capability that cannot be read)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    role, name = role_of(cert_pem)
    cert = x509.load_pem_x509_certificate(cert_pem)
    capability = FULL
    try:
        ext = cert.extensions.get_extension_for_oid(x509.ObjectIdentifier(CAPABILITY_OID))
    except x509.ExtensionNotFound:
        pass
    else:
        if role != "client":
            raise ConfigError(f"a {role} certificate may not carry a capability")
        value = ext.value
        if not isinstance(value, x509.UnrecognizedExtension):
            raise ConfigError("the certificate's capability extension is not ours")
        capability = Capability.from_json(value.value)
    return PeerCertificate(role, name, capability, cert.fingerprint(hashes.SHA256()))


def _missing(path: Path, directory: Path, name: str) -> str:
    """What to do about PATH of the identity NAME, missing from DIRECTORY."""
    if not directory.is_dir():
        return (f"no TLS directory {directory}: make one with `mosafs certs init --dir "
                f"{directory}`, then `mosafs certs issue {name} --dir {directory} --role ROLE`")
    if path.name == "ca.crt":
        # Without the CA nothing can be issued or checked: `issue` would fail the same way.
        return (f"{path} is missing: copy ca.crt from where the cluster's CA was made, or "
                f"make a new CA with `mosafs certs init --dir {directory}` (and then every "
                f"certificate with `mosafs certs issue`)")
    return (f"{path} is missing (make it with `mosafs certs issue {name} --dir {directory} "
            f"--role ROLE`)")


def load(directory: Path, name: str) -> Identity:
    """The identity NAME of TLS directory DIRECTORY; clear errors for what is missing."""
    paths = [directory / "ca.crt", directory / f"{name}.crt", directory / f"{name}.key"]
    data = []
    for path in paths:
        try:
            data.append(path.read_bytes())
        except FileNotFoundError:
            raise NotFound(_missing(path, directory, name)) from None
        except PermissionError:
            raise ConfigError(f"cannot read {path}: permission denied") from None
    role, common = role_of(data[1])
    return Identity(data[0], data[1], data[2], role, common, directory)
