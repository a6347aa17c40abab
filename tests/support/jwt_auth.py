"""A decentralised-auth (operator/account/user JWT) setup for testing ``.creds`` files.

Builds NATS JWTs (ed25519-nkey signed) with the nkeys library and writes the server config that
preloads the account in a memory resolver, plus a user ``.creds`` file.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import nkeys


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _keypair(prefix: int) -> nkeys.KeyPair:
    return nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), prefix)))


def _jwt(signer: nkeys.KeyPair, subject: str, name: str, nats: dict) -> str:
    claims = {"iat": int(time.time()), "iss": signer.public_key.decode(), "name": name, "sub": subject,
              "nats": nats}
    claims["jti"] = base64.b32encode(hashlib.sha256(json.dumps(claims, sort_keys=True).encode()).digest()).decode()
    header = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    body = _b64(json.dumps(claims).encode())
    signature = _b64(signer.sign(f"{header}.{body}".encode()))
    return f"{header}.{body}.{signature}"


@dataclass
class DecentralizedAuth:
    server_config: dict
    creds_file: Path
    user_seed: str
    user_jwt: str


def make_decentralized_auth(directory: Path) -> DecentralizedAuth:
    """Operator + JetStream-enabled account + user; returns server config and a user .creds file."""
    operator = _keypair(nkeys.PREFIX_BYTE_OPERATOR)
    account = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    system = _keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    user = _keypair(nkeys.PREFIX_BYTE_USER)
    op_pub, acc_pub, user_pub = (k.public_key.decode() for k in (operator, account, user))
    operator_jwt = _jwt(operator, op_pub, "TEST_OP", {"type": "operator", "version": 2})
    unlimited = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True,
                 "conn": -1, "leaf": -1, "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}
    account_jwt = _jwt(operator, acc_pub, "APP", {"limits": unlimited, "type": "account", "version": 2})
    sys_pub = system.public_key.decode()
    system_jwt = _jwt(operator, sys_pub, "SYS", {"limits": {**unlimited, "mem_storage": 0, "disk_storage": 0},
                                                  "type": "account", "version": 2})
    user_jwt = _jwt(account, user_pub, "airflow",
                    {"pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2})
    user_seed = user.seed.decode()
    directory.mkdir(parents=True, exist_ok=True)
    creds = directory / "airflow.creds"
    creds.write_text(
        "-----BEGIN NATS USER JWT-----\n"
        f"{user_jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{user_seed}\n"
        "------END USER NKEY SEED------\n"
    )
    config = {"operator": operator_jwt, "system_account": sys_pub, "resolver": "MEMORY",
              "resolver_preload": {acc_pub: account_jwt, sys_pub: system_jwt}}
    return DecentralizedAuth(server_config=config, creds_file=creds, user_seed=user_seed, user_jwt=user_jwt)
