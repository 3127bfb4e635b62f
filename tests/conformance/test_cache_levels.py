"""ZODB's basic, MVCC and persistence suites with the cache levels beside the state
cache on: the persistent cache (saved every 50 ms, so saves run during the tests, and
read back when PersistentStorage reopens the storage) and the Redis level (on the
server at 127.0.0.1:6379, under a prefix of the test's own, deleted afterwards).
"""
from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest
import redis
from ZODB.tests import BasicStorage, PersistentStorage, Synchronization
from ZODB.tests.testMVCCMappingStorage import MVCCTests

from tests.conformance.suite import StorageSuite

REDIS_URL = "redis://127.0.0.1:6379/0"


class PersistentCacheOn(StorageSuite):
    def storage_options(self, tmp_path: Any) -> dict[str, Any]:
        return {"cache_persistent_dir": str(tmp_path / "state-cache"),
                "cache_persistent_interval": 0.05}


class RedisCacheOn(StorageSuite):
    prefix = ""

    @pytest.fixture(autouse=True)
    def _redis_keys_removed(self) -> Iterator[None]:
        client = redis.Redis.from_url(REDIS_URL)
        client.ping()       # down: the test fails (the storage would only warn)
        yield
        keys = list(client.scan_iter(match=f"{self.prefix}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()

    def storage_options(self, tmp_path: Any) -> dict[str, Any]:
        self.prefix = f"zodbsql-test-{uuid.uuid4().hex}:"
        return {"cache_redis_url": REDIS_URL, "cache_redis_prefix": self.prefix}


class TestBasicPersistentCache(PersistentCacheOn, BasicStorage.BasicStorage):
    pass


class TestMVCCPersistentCache(PersistentCacheOn, MVCCTests):
    pass


class TestReopenPersistentCache(PersistentCacheOn, PersistentStorage.PersistentStorage):
    pass


class TestSynchronizationPersistentCache(PersistentCacheOn,
                                         Synchronization.SynchronizedStorage):
    pass


class TestBasicRedisCache(RedisCacheOn, BasicStorage.BasicStorage):
    pass


class TestMVCCRedisCache(RedisCacheOn, MVCCTests):
    pass


class TestReopenRedisCache(RedisCacheOn, PersistentStorage.PersistentStorage):
    pass
