"""mask_secrets and mask_config: every form a password takes in zodbsql's input."""
from __future__ import annotations

import pytest

from zodbsql.masking import mask_config, mask_secrets

SECRET = "pa55w0rd"


@pytest.mark.parametrize("text, kept", [
    (f"postgresql://zodb:{SECRET}@db:5432/zodb", "postgresql://zodb:***@db:5432/zodb"),
    (f"zodbsql+postgresql://zodb:{SECRET}@db/zodb?schema=s", "zodbsql+postgresql://zodb:***@db"),
    (f"postgres://zodb:{SECRET}@db/zodb", "postgres://zodb:***@db/zodb"),
    (f"zodbsql+mysql://root:{SECRET}@db:3306/zodb", "zodbsql+mysql://root:***@db:3306/zodb"),
    (f"mysql://root:p@ss/{SECRET}@db/zodb", "mysql://root:***@db/zodb"),  # unencoded @ and /
    (f"unknown option 'x' in 'mysql://root:{SECRET}@db/zodb?x=1'", "?x=1'"),
    (f"host=db password={SECRET} dbname=zodb", "host=db password=*** dbname=zodb"),
    (f"host=db password = '{SECRET} with\\' quote' dbname=zodb", "password = *** dbname=zodb"),
    (f"host=db sslpassword={SECRET}", "sslpassword=***"),
    (f"postgresql://zodb@db/zodb?password={SECRET}&sslmode=require",
     "?password=***&sslmode=require"),
    (f"{{'user': 'root', 'passwd': '{SECRET}', 'db': 'zodb'}}", "'passwd': ***, 'db'"),
    (f'{{"password": "{SECRET}"}}', '"password": ***'),
    # A password later in a query, after another parameter.
    (f"mysql://root@db/zodb?ssl=1&password={SECRET}&x=1", "?ssl=1&password=***&x=1"),
    # A quoted password with spaces, however it is quoted; an unterminated quote masks to
    # the end (its end is ambiguous).
    (f"password='{SECRET} x {SECRET}", "password=***"),
    (f'{{"passwd": "{SECRET} x {SECRET}"}}', '{"passwd": ***}'),
    # A password that is not a str in a mapping's repr.
    (f"{{'passwd': b'{SECRET}', 'db': 'zodb'}}", "'passwd': ***, 'db'"),
    (f"{{'password': {SECRET}}}", "'password': ***}"),
])
def test_every_form_of_password_is_masked(text: str, kept: str) -> None:
    masked = mask_secrets(text)
    assert SECRET not in masked and "55w0" not in masked, masked
    assert kept in masked, masked


@pytest.mark.parametrize("text", [
    "postgresql://zodb@db:5432/zodb?schema=main",
    "file:///var/Data.fs", "zeo://localhost:8100", "sqlite:///var/Data.sqlite",
    "FATAL:  password authentication failed for user \"zodb\"",
    "host=db dbname=zodb user=zodb",
    # Text after a query's password, and an @ after a URL without one, are kept.
    "postgresql://zodb@db:5432/zodb?application_name=ops@site",
])
def test_text_without_a_password_is_left_alone(text: str) -> None:
    assert mask_secrets(text) == text


def test_zconfig_text_masks_passwd_lines() -> None:
    text = (f"<mysql>\n  user root\n  passwd {SECRET}\n</mysql>\n"
            f"<postgresql>\n  dsn host=db password={SECRET}\n</postgresql>\n")
    masked = mask_config(text)
    assert SECRET not in masked
    assert "  passwd ***\n" in masked and "dsn host=db password=***" in masked
    assert "user root" in masked


def test_masking_stops_where_the_password_does() -> None:
    assert mask_secrets(f"connect to mysql://root@db/zodb?password={SECRET} failed: timeout") == (
        "connect to mysql://root@db/zodb?password=*** failed: timeout")
    assert mask_secrets(f"mysql://root@db/zodb?password={SECRET}#top") == (
        "mysql://root@db/zodb?password=***#top")
    assert mask_secrets(f"host=db password='{SECRET} x' dbname=zodb") == (
        "host=db password=*** dbname=zodb")
