"""SASL_SSL for the embedded broker (`stoker kafka up --secure`): TLS everywhere, SCRAM-SHA-512 users,
ACLs.

* A local CA signs the broker's certificate (SAN ``IP:127.0.0.1``, so clients verify the host),
  made with openssl in ``<home>/tls`` (keys 0600).
* Clients connect on ``SASL_SSL`` as user ``stoker`` (SCRAM-SHA-512) and may use only what the
  pipeline needs: topics, groups and transactional ids named ``stoker*``.
* The controller and inter-broker listeners are TLS with client certificates (the broker's own
  identity ``CN=stoker-broker``, the only super user); nothing listens in plain text.
* The password is random, lives in ``<home>/credentials.json`` (0600), and is set through the
  Admin API over the mTLS listener: it never appears on a command line.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from pathlib import Path
from typing import Any

from stoker.exceptions import StackError

USER = "stoker"
BROKER_CN = "stoker-broker"
MECHANISM = "SCRAM-SHA-512"


def tls_dir(home: Path) -> Path:
    return home / "tls"


def credentials_file(home: Path) -> Path:
    return home / "credentials.json"


def _openssl(*args: str, cwd: Path) -> None:
    res = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise StackError(f"openssl {args[0]} failed in {cwd}: {res.stderr.strip()[-500:]}")


def make_certificates(home: Path, hosts: tuple[str, ...] = ()) -> Path:
    """The CA and the broker's key and certificate (kept when present), valid for 127.0.0.1,
    localhost and ``hosts``; returns the folder."""
    d = tls_dir(home)
    if (d / "broker.pem").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(0o700)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "3650",
             "-subj", "/CN=stoker-local-ca", "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "broker.key", "-out", "broker.csr",
             "-subj", f"/CN={BROKER_CN}", cwd=d)
    names = ",".join(f"DNS:{h}" for h in ("localhost", *hosts))
    (d / "broker.ext").write_text(f"subjectAltName=IP:127.0.0.1,{names}\n"
                                  "extendedKeyUsage=serverAuth,clientAuth\n")
    _openssl("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "broker.crt", "-days", "3650", "-extfile", "broker.ext", cwd=d)
    # Kafka's PEM key store: the PKCS#8 key, then the certificate chain
    _openssl("pkcs8", "-topk8", "-nocrypt", "-in", "broker.key", "-out", "broker.p8", cwd=d)
    (d / "broker.pem").write_text((d / "broker.p8").read_text() + (d / "broker.crt").read_text())
    for f in ("ca.key", "broker.key", "broker.p8", "broker.pem"):
        (d / f).chmod(0o600)
    return d


def password(home: Path) -> str:
    """The ``stoker`` user's password, made once (0600 file)."""
    f = credentials_file(home)
    if f.exists():
        return str(json.loads(f.read_text())["password"])
    from stoker.paths import write_private

    pw = secrets.token_urlsafe(24)
    write_private(f, json.dumps({"user": USER, "mechanism": MECHANISM, "password": pw}))
    return pw


def server_properties(port: int, controller_port: int, internal_port: int, d: Path) -> list[str]:
    return [
        f"listeners=SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port},"
        f"INTERNAL://127.0.0.1:{internal_port}",
        f"advertised.listeners=SASL_SSL://127.0.0.1:{port},INTERNAL://127.0.0.1:{internal_port}",
        "controller.listener.names=CONTROLLER",
        "listener.security.protocol.map=CONTROLLER:SSL,INTERNAL:SSL,SASL_SSL:SASL_SSL",
        "inter.broker.listener.name=INTERNAL",
        "listener.name.controller.ssl.client.auth=required",
        "listener.name.internal.ssl.client.auth=required",
        f"sasl.enabled.mechanisms={MECHANISM}",
        # the server side of SCRAM needs a login module entry, with no credentials of its own
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config="
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "ssl.keystore.type=PEM",
        f"ssl.keystore.location={d / 'broker.pem'}",
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={d / 'ca.pem'}",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        f"super.users=User:CN={BROKER_CN}",
        "allow.everyone.if.no.acl.found=false",
    ]


def internal_config(bootstrap: str, d: Path) -> dict[str, str]:
    """The broker's own identity over the mTLS listener (``host:port``): for setting users and ACLs."""
    return {"bootstrap.servers": bootstrap, "security.protocol": "SSL",
            "ssl.ca.location": str(d / "ca.pem"), "ssl.certificate.location": str(d / "broker.crt"),
            "ssl.key.location": str(d / "broker.key")}


def client_config(port: int | str, home: Path) -> dict[str, str]:
    """The pipeline's client settings for the broker at ``port`` on 127.0.0.1 (or a ``host:port``)."""
    bootstrap = port if isinstance(port, str) else f"127.0.0.1:{port}"
    return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanism": MECHANISM,
            "sasl.username": USER, "sasl.password": password(home),
            "ssl.ca.location": str(tls_dir(home) / "ca.pem")}


def grant(config: dict[str, Any], home: Path) -> None:
    """Create (or reset) the ``stoker`` user and its ACLs: ``stoker*`` topics, groups and transactional ids."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    from stoker.kafka import clients as kafka_clients
    from stoker.kafka import topics as ktopics

    client = kafka_clients.admin(config)
    upsert = UserScramCredentialUpsertion(USER, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                          password(home).encode(), secrets.token_bytes(16))
    ktopics._wait(client.alter_user_scram_credentials([upsert]), "alter_user_scram_credentials")
    bindings = [AclBinding(kind, "stoker", ResourcePatternType.PREFIXED, f"User:{USER}", "*", AclOperation.ALL,
                           AclPermissionType.ALLOW)
                for kind in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID)]
    ktopics._wait(client.create_acls(bindings), "create_acls")


def main(argv: list[str] | None = None) -> int:
    """``python -m stoker_local.broker.secure setup DIR [--host H]`` makes the CA, the broker's
    certificate and the password file in DIR; ``grant DIR HOST:PORT`` sets the user and ACLs over the
    broker's mTLS listener. docker-compose.yaml's ``secure`` profile runs both."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m stoker_local.broker.secure", description=main.__doc__)
    ap.add_argument("action", choices=["setup", "grant"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("bootstrap", nargs="?", help="grant: the broker's mTLS (INTERNAL) listener, host:port")
    ap.add_argument("--host", action="append", default=[], help="setup: a DNS name the certificate must carry")
    args = ap.parse_args(argv)
    if args.action == "setup":
        make_certificates(args.dir, tuple(args.host))
        password(args.dir)
        print(f"CA {tls_dir(args.dir) / 'ca.pem'}; password of user {USER} in {credentials_file(args.dir)}")
        return 0
    if not args.bootstrap:
        ap.error("grant needs the broker's INTERNAL listener, host:port")
    from stoker.kafka import topics as ktopics

    config = internal_config(args.bootstrap, tls_dir(args.dir))
    ktopics.check_reachable(config, timeout=60)
    grant(config, args.dir)
    print(f"user {USER} ({MECHANISM}) and its ACLs (stoker* topics, groups, transactional ids) set")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
