"""The tools take a Zope instance's zope.conf, written the way mkwsgiinstance writes it:
Zope's own keys and sections are passed over, a database is named by its <zodb_db>."""
from __future__ import annotations

import pathlib

import pytest
import transaction
from persistent.mapping import PersistentMapping

import zodbsql
from zodbsql.cli import zopeconf
from zodbsql.cli.main import main

ZOPE_CONF = """\
%define INSTANCE {instance}
instancehome $INSTANCE

%define CLIENTHOME $INSTANCE/var
clienthome $CLIENTHOME

debug-mode off
security-policy-implementation C
verbose-security off
default-zpublisher-encoding utf-8

<environment>
    zope_i18n_compile_mo_files true
    CHAMELEON_CACHE $INSTANCE/var/cache
</environment>

<dos_protection>
    form-memory-limit 1MB
</dos_protection>

%import zodbsql
<zodb_db main>
    # Main database
    cache-size 50000
    <zodbsql>
      blob-dir $INSTANCE/var/blobcache
      <sqlite3>
        path $INSTANCE/var/Data.sqlite
      </sqlite3>
    </zodbsql>
    mount-point /
</zodb_db>

<zodb_db temporary>
    <temporarystorage>
      name Temporary database (for sessions)
    </temporarystorage>
    mount-point /temp_folder
    container-class Products.TemporaryFolder.TemporaryContainer
</zodb_db>
"""


@pytest.fixture
def instance(tmp_path: pathlib.Path) -> pathlib.Path:
    """A Zope instance folder: etc/zope.conf and a database with some content."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "var").mkdir()
    (tmp_path / "etc" / "zope.conf").write_text(ZOPE_CONF.format(instance=tmp_path))
    db = zodbsql.open_db(f"sqlite://{tmp_path / 'var' / 'Data.sqlite'}",
                         blob_dir=str(tmp_path / "var" / "blobcache"))
    for i in range(3):
        with db.transaction() as conn:
            conn.root()["folder"] = PersistentMapping(step=i)
    db.close()
    transaction.abort()
    return tmp_path


def test_verify_pack_and_doctor_read_a_zope_conf(instance: pathlib.Path) -> None:
    conf = instance / "etc" / "zope.conf"
    assert main(["verify", f"{conf}#main", "--quiet"]) == 0
    assert main(["pack", f"{conf}#main", "--quiet"]) == 0
    assert main(["doctor", f"{conf}#main"]) == 0
    storage = zodbsql.open_storage(f"sqlite://{instance / 'var' / 'Data.sqlite'}")
    try:     # pack kept the current revision only
        assert len(storage.history(b"\0" * 8, size=10)) == 1
    finally:
        storage.close()


def test_a_database_that_is_not_there_is_named(instance: pathlib.Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    conf = instance / "etc" / "zope.conf"
    assert main(["verify", f"{conf}#catalog", "--quiet"]) == 2
    assert ("has no <zodb_db catalog> section (it has: main, temporary)"
            in capsys.readouterr().err)
    # ZConfig's line numbers are the file's: Zope's keys are read as empty lines.
    (instance / "etc" / "zope.conf").write_text(
        ZOPE_CONF.format(instance=instance).replace("sqlite3>", "sqlite4>"))
    assert main(["verify", f"{conf}#main", "--quiet"]) == 2
    assert "unknown type name: 'sqlite4' (line 27 in" in capsys.readouterr().err


def test_only_the_named_database_is_read() -> None:
    text = ZOPE_CONF.format(instance="/srv/site")
    assert zopeconf.database_names(text) == ["main", "temporary"]
    converted = zopeconf.as_database_config(text, "main")
    assert len(converted.splitlines()) == len(text.splitlines())
    assert [line for line in converted.splitlines() if line] == [
        "%define INSTANCE /srv/site", "%define CLIENTHOME $INSTANCE/var", "%import zodbsql",
        "<zodb main>", "    <zodbsql>", "      blob-dir $INSTANCE/var/blobcache",
        "      <sqlite3>", "        path $INSTANCE/var/Data.sqlite", "      </sqlite3>",
        "    </zodbsql>", "</zodb>"]
    assert "<zodb temporary>" in zopeconf.as_database_config(text)
    assert not zopeconf.is_zope_config("<zodb main>\n  <mappingstorage/>\n</zodb>\n")
