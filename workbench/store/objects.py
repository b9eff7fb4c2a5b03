"""Store locations on object storage: `s3://bucket/prefix`, for stores that several processes
write at once (`workbench run SPEC --shard k/N` with an s3:// store).

This is the one place that knows about URLs: `location(path)` turns a store path into a local
`Path` (as before) or an `ObjectStore`, which gives icechunk its storage. Endpoint and
credentials come from the standard AWS environment (`AwsEnv`); `allow_http` only for an
`http://` endpoint (an S3-compatible server on loopback, e.g. moto in the tests).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from ..errors import StoreError, StorePathError

SCHEME = "s3://"
# a TCP connect to the endpoint before icechunk is asked: its own retries take ~30 s to give up
_CONNECT_TIMEOUT_S = 5.0


def is_url(path: Any) -> bool:
    return isinstance(path, ObjectStore) or str(path).startswith(SCHEME)


def location(path: Any) -> Path | ObjectStore:
    """A store path as the store module uses it: an `ObjectStore` for `s3://...`, else a Path."""
    if isinstance(path, ObjectStore):
        return path
    return ObjectStore.parse(str(path)) if is_url(path) else Path(path)


def _aws_env() -> Any:
    # pydantic-settings, as WORKBENCH_REMOTE_* (backends.remote); imported here so that reading a
    # local store never needs it
    from pydantic import SecretStr
    from pydantic_settings import BaseSettings, SettingsConfigDict

    class AwsEnv(BaseSettings):
        """AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
        AWS_REGION (else AWS_DEFAULT_REGION); unset or empty = not given."""

        model_config = SettingsConfigDict(env_prefix="AWS_", env_ignore_empty=True, extra="ignore")

        endpoint_url: Optional[str] = None
        access_key_id: Optional[str] = None
        secret_access_key: Optional[SecretStr] = None
        session_token: Optional[SecretStr] = None
        region: Optional[str] = None
        default_region: Optional[str] = None

    return AwsEnv()


def _short(err: BaseException) -> str:
    """An error's gist on one line: icechunk's first line, without its context trace (shared by
    the store's modules; here, at the bottom of their imports)."""
    text = " ".join(str(err).split("| \n")[0].split("context:")[0].split()).strip(" |")
    text = text[2:] if text.startswith("x ") else text
    return text[:300] + ("..." if len(text) > 300 else "")


@dataclass(frozen=True)
class ObjectStore:
    """`s3://bucket/prefix`: a store in an S3 bucket (AWS or any S3-compatible server)."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, url: str) -> ObjectStore:
        parts = urlsplit(url)
        prefix = parts.path.strip("/")
        if not parts.netloc or not prefix:
            raise StorePathError(f"store URL {url!r} needs a bucket and a prefix",
                                 hint="write it as s3://BUCKET/PREFIX, e.g. s3://my-bucket/stores/demo.zarr")
        return cls(parts.netloc, prefix)

    def __str__(self) -> str:
        return f"{SCHEME}{self.bucket}/{self.prefix}"

    @property
    def name(self) -> str:
        return self.prefix.rsplit("/", 1)[-1]

    def settings(self) -> dict[str, Any]:
        env = _aws_env()
        endpoint = env.endpoint_url
        settings: dict[str, Any] = {
            "bucket": self.bucket, "prefix": self.prefix,
            "region": env.region or env.default_region or ("us-east-1" if endpoint else None),
            "access_key_id": env.access_key_id,
            "secret_access_key": env.secret_access_key.get_secret_value() if env.secret_access_key else None,
            "session_token": env.session_token.get_secret_value() if env.session_token else None,
        }
        if endpoint:  # an S3-compatible server: path-style addressing, plain HTTP only if asked for
            settings.update(endpoint_url=endpoint, allow_http=endpoint.startswith("http://"), force_path_style=True)
        if not (env.access_key_id and env.secret_access_key):
            settings.update(access_key_id=None, secret_access_key=None, session_token=None, from_env=True)
        return settings

    def storage(self) -> Any:
        import icechunk

        return icechunk.s3_storage(**self.settings())

    def endpoint(self) -> str:
        settings = self.settings()
        return settings.get("endpoint_url") or f"https://s3.{settings['region'] or 'us-east-1'}.amazonaws.com"

    def check_reachable(self) -> None:
        """Refuse at once, in one line, an endpoint nothing answers at (a TCP connect)."""
        endpoint = self.endpoint()
        parts = urlsplit(endpoint)
        port = parts.port or (80 if parts.scheme == "http" else 443)
        try:
            socket.create_connection((parts.hostname or "", port), timeout=_CONNECT_TIMEOUT_S).close()
        except OSError as err:
            raise StoreError(f"cannot reach the object store of {self} at {endpoint}: {err.strerror or err}",
                             hint="check AWS_ENDPOINT_URL (and that the server runs), AWS_REGION and the "
                                  "network") from None

    def exists(self) -> bool:
        """Whether an icechunk repository lives at this prefix (the endpoint checked first)."""
        import icechunk

        self.check_reachable()
        storage = self.storage()
        try:
            if icechunk.Repository.exists(storage):
                return True
            answered: Exception | None = None
        except Exception as err:  # a branch pointer that does not parse, or no access
            answered = err
        # a repository whose branch pointer is missing or damaged still holds its config: a store
        # to repair (workbench.repair), not an empty prefix to create one in
        try:
            return icechunk.Repository.fetch_config(storage) is not None or answered is not None
        except Exception:
            if answered is None:  # the bucket answered: it is the config that does not parse
                return True
            raise StoreError(f"cannot read the object store {self}: {_short(answered)}",
                             hint="check the bucket name, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and "
                                  "AWS_ENDPOINT_URL") from None
