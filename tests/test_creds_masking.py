"""What of a ``.creds`` file is registered with Airflow's secret masker: its JWT and nkey seed, not the
boilerplate every such file carries (markers, the IMPORTANT banner, its explanation)."""

from __future__ import annotations

from pathlib import Path

from airflow_jetstream.client.settings import ConnectionSettings, creds_file_secrets

JWT = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJqdGkiOiJYWFgifQ.c2lnbmF0dXJl"
SEED = "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4"
# The layout `nsc generate creds` writes.
NSC_CREDS = f"""-----BEGIN NATS USER JWT-----
{JWT}
------END NATS USER JWT------

************************* IMPORTANT *************************
NKEY Seed printed below can be used to sign and prove identity.
NKEYs are sensitive and should be treated as secrets.

-----BEGIN USER NKEY SEED-----
{SEED}
------END USER NKEY SEED------

*************************************************************
"""


def test_only_the_jwt_and_the_seed_of_a_creds_file_are_secrets(tmp_path: Path) -> None:
    creds = tmp_path / "user.creds"
    creds.write_text(NSC_CREDS)
    settings = ConnectionSettings(servers="127.0.0.1:4222", creds_file=str(creds), token="tok")
    assert settings.secrets() == ["tok", JWT, SEED]


def test_a_file_without_markers_is_secret_line_by_line() -> None:
    assert creds_file_secrets(f"\n{JWT}\r\n{SEED}\n") == [JWT, SEED]
    assert creds_file_secrets(NSC_CREDS.replace("\n", "\r\n")) == [JWT, SEED]
