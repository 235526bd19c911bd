"""The s4fs service configuration: one TOML file, read into frozen dataclasses.

The file is ``/etc/s4fs/config.toml`` unless ``load_config`` is given a path or the
environment names one in ``S4FS_CONFIG``. Every key is optional; top-level keys must come
before the first ``[table]`` (a TOML rule)::

    store = "s3://my-bucket/checkpoints"   # a directory, file:///dir or s3://bucket/prefix
    mountpoint = "/mnt/s4"
    cache_dir = "/var/cache/s4fs"
    device = "auto"                        # "cpu", "cuda" or "auto" (the GPU below 16 cores)
    allow_other = true                     # let users other than s4fs use the mount

    [health]
    address = "0.0.0.0"
    port = 8080

    [marketplace]                          # AWS Marketplace RegisterUsage at boot
    enabled = false
    product_code = ""
    public_key_version = 1
    region = ""                            # "" reads it from IMDSv2

    [runner]
    manage_mount = true                    # false: wait for a mount made by mnt-s4.mount

``cache_dir``, ``device`` and ``allow_other`` are the ``s4fs mount`` options of those
names (declared with ``config=True`` in :mod:`s4fs.options`); :meth:`Config.mount_flags`
turns them into the mount's flags.

A bad file raises :class:`ConfigError`, whose message names the file, the key, what was
wrong and what to write instead.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field, fields
from typing import Any

from s4fs.codec import DEVICES
from s4fs.errors import InvalidArgument
from s4fs.options import OPTIONS, to_flags

DEFAULT_PATH = "/etc/s4fs/config.toml"
ENV_VAR = "S4FS_CONFIG"

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")
_PRODUCT_CODE = re.compile(r"^[A-Za-z0-9]{1,255}$")


class ConfigError(InvalidArgument):
    """The configuration file is missing, unreadable or has a bad value."""


@dataclass(frozen=True)
class HealthConfig:
    """Where the runner serves ``GET /healthz`` and ``GET /metrics``."""

    address: str = "0.0.0.0"
    port: int = 8080                 # 0 picks a free port (tests)


@dataclass(frozen=True)
class MarketplaceConfig:
    """AWS Marketplace entitlement: ``RegisterUsage`` once at boot, fail-closed."""

    enabled: bool = False
    product_code: str = ""
    public_key_version: int = 1
    region: str = ""                 # "" → read from IMDSv2
    endpoint_url: str = ""           # "" → the regional public endpoint
    imds_url: str = "http://169.254.169.254"
    timeout_s: float = 3.0           # IMDS and API connect/read timeout


@dataclass(frozen=True)
class RunnerConfig:
    """How ``s4fs runner`` supervises the mount."""

    manage_mount: bool = True        # False: the mount is made elsewhere (mnt-s4.mount)
    mount_timeout_s: float = 60.0    # how long the mount may take to come up
    stop_timeout_s: float = 60.0     # how long open files may delay a clean unmount
    mount_command: tuple[str, ...] = ()   # argv replacing `s4fs mount ...` (wrappers)
    metrics_dir: str = ""            # "" → $RUNTIME_DIRECTORY/metrics or a private temp dir


@dataclass(frozen=True)
class Config:
    store: str = "/var/lib/s4fs/store"
    mountpoint: str = "/mnt/s4"
    cache_dir: str = "/var/cache/s4fs"
    device: str = "auto"
    allow_other: bool = True
    health: HealthConfig = field(default_factory=HealthConfig)
    marketplace: MarketplaceConfig = field(default_factory=MarketplaceConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    #: the file this was read from (None: built-in defaults)
    source: str | None = field(default=None, compare=False)

    def mount_flags(self) -> list[str]:
        """The ``s4fs mount`` flags for the mount options this config sets."""
        return to_flags({o.name: getattr(self, o.name) for o in OPTIONS if o.config})


_TABLES = {"health": HealthConfig, "marketplace": MarketplaceConfig, "runner": RunnerConfig}


def load_config(path: str | os.PathLike | None = None) -> Config:
    """Read the config file: ``path``, else ``$S4FS_CONFIG``, else ``/etc/s4fs/config.toml``.

    A missing default file gives the built-in defaults (a local store in
    ``/var/lib/s4fs/store``); a missing file that was asked for by name is an error."""
    explicit = path is not None or bool(os.environ.get(ENV_VAR))
    where = os.fspath(path) if path is not None else os.environ.get(ENV_VAR) or DEFAULT_PATH
    try:
        with open(where, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        if not explicit:
            return Config()
        raise ConfigError(f"config file {where} does not exist; create it (see "
                          f"deploy/config.example.toml) or point {ENV_VAR} at another file") from None
    except PermissionError:
        raise ConfigError(f"cannot read config file {where}: permission denied; the service "
                          "user needs read access (install.sh makes it root:s4fs, mode 0640)") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {where}: {exc}") from None
    return parse_config(raw, source=where)


def parse_config(text: str | bytes, source: str = "<string>") -> Config:
    """Parse and validate TOML text (see the module docstring for the keys)."""
    toml = _toml()
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config {source} is not UTF-8 text: {exc}") from None
    try:
        data = toml.loads(text)
    except toml.TOMLDecodeError as exc:
        raise ConfigError(f"config {source} is not valid TOML: {exc}") from None
    return _build(data, source)


# --- validation ---------------------------------------------------------------------

def _toml():
    try:
        import tomllib
        return tomllib
    except ModuleNotFoundError:          # Python 3.10 (Ubuntu 22.04)
        try:
            import tomli
            return tomli
        except ModuleNotFoundError:
            raise ConfigError("reading the config needs Python 3.11+ or the 'tomli' package "
                              "on Python 3.10: pip install tomli") from None


def _build(data: dict[str, Any], source: str) -> Config:
    top = {f.name for f in fields(Config)} - {"source"} - set(_TABLES)
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in _TABLES:
            if not isinstance(value, dict):
                raise ConfigError(f"config {source}: '{key}' must be a table; write it as "
                                  f"[{key}] followed by its keys")
            values[key] = _build_table(key, value, source, top)
        elif key in top:
            values[key] = value
        else:
            raise ConfigError(f"config {source}: unknown key '{key}' at top level"
                              f"{_suggest(key, top | set(_TABLES))}; remove it or fix the spelling")
    cfg = Config(**values, source=source)
    for key in top:
        _check_top(cfg, key, source)
    return cfg


def _build_table(name: str, table: dict, source: str, top: set[str]):
    cls = _TABLES[name]
    known = {f.name for f in fields(cls)}
    for key in table:
        if key not in known:
            hint = _suggest(key, known)
            if key in top and not hint:
                hint = (f" ('{key}' is a top-level key: move it above the first [table], "
                        "since TOML puts every key after [" + name + "] into that table)")
            raise ConfigError(f"config {source}: unknown key '{key}' in [{name}]{hint}; "
                              "remove it or fix the spelling")
    kwargs = dict(table)
    if name == "runner" and "mount_command" in kwargs:
        cmd = kwargs["mount_command"]
        if not isinstance(cmd, list) or not all(isinstance(a, str) and a for a in cmd):
            raise ConfigError(f"config {source}: [runner] mount_command must be a list of "
                              f"non-empty strings (an argv), got {cmd!r}")
        kwargs["mount_command"] = tuple(cmd)
    obj = cls(**kwargs)
    for f in fields(cls):
        _check_field(obj, name, f.name, source)
    return obj


def _type_error(where: str, key: str, want: str, got: Any, example: str, source: str):
    return ConfigError(f"config {source}: {where}{key} must be {want}, got {got!r} "
                       f"({type(got).__name__}); write e.g. {key} = {example}")


def _want_bool(where, key, value, source):
    if not isinstance(value, bool):
        raise _type_error(where, key, "true or false", value, "true", source)


def _want_str(where, key, value, source, example='"..."'):
    if not isinstance(value, str):
        raise _type_error(where, key, "a string", value, example, source)


def _want_number(where, key, value, source, example="60", minimum=0.0):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > minimum:
        raise _type_error(where, key, f"a number greater than {minimum:g}", value, example, source)


def _want_abs_path(where, key, value, source, example):
    _want_str(where, key, value, source, f'"{example}"')
    if not value.startswith("/"):
        raise ConfigError(f"config {source}: {where}{key} must be an absolute path, got "
                          f"{value!r}; write e.g. {key} = \"{example}\"")


def _check_top(cfg: Config, key: str, source: str) -> None:
    value = getattr(cfg, key)
    if key == "store":
        _check_store(value, source)
    elif key == "mountpoint":
        _want_abs_path("", key, value, source, "/mnt/s4")
        if os.path.normpath(value) == "/":
            raise ConfigError(f"config {source}: mountpoint must not be '/'; write e.g. "
                              'mountpoint = "/mnt/s4"')
    elif key == "cache_dir":
        _want_abs_path("", key, value, source, "/var/cache/s4fs")
    elif key == "device":
        if value not in DEVICES:
            raise ConfigError(f"config {source}: device must be one of \"auto\", \"cpu\" or "
                              f"\"cuda\", got {value!r}; \"auto\" uses a GPU when one is usable")
    elif key == "allow_other":
        _want_bool("", key, value, source)


def _check_store(value: Any, source: str) -> None:
    _want_str("", "store", value, source, '"s3://bucket/prefix"')
    if value.startswith("s3://"):
        bucket = re.split(r"[/?]", value[5:], maxsplit=1)[0]
        if not _BUCKET.match(bucket):
            raise ConfigError(f"config {source}: store {value!r} does not name a valid S3 bucket "
                              f"({bucket!r}); write e.g. store = \"s3://my-bucket/checkpoints\"")
    elif value.startswith("file://"):
        if not value[7:].startswith("/"):
            raise ConfigError(f"config {source}: store {value!r} must be file:///absolute/dir")
    elif not value.startswith("/"):
        raise ConfigError(f"config {source}: store must be an absolute directory, a "
                          f"file:///dir URL or s3://bucket/prefix, got {value!r}")


def _check_field(obj, table: str, key: str, source: str) -> None:
    where = f"[{table}] "
    value = getattr(obj, key)
    if table == "health":
        if key == "address":
            _want_str(where, key, value, source, '"0.0.0.0"')
            if not value or any(c.isspace() for c in value):
                raise ConfigError(f"config {source}: [health] address must be an IP address or "
                                  f"host name, got {value!r}; write e.g. address = \"0.0.0.0\"")
        elif key == "port":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
                raise _type_error(where, key, "an integer from 0 to 65535", value, "8080", source)
    elif table == "marketplace":
        if key == "enabled":
            _want_bool(where, key, value, source)
        elif key == "product_code":
            _want_str(where, key, value, source)
            if obj.enabled and not _PRODUCT_CODE.match(value):
                raise ConfigError(f"config {source}: [marketplace] is enabled but product_code "
                                  f"is {value!r}; set it to the product code of the AWS "
                                  "Marketplace listing (letters and digits), or set enabled = false")
        elif key == "public_key_version":
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _type_error(where, key, "an integer >= 1", value, "1", source)
        elif key == "region":
            _want_str(where, key, value, source, '"us-east-1"')
            if value and not _REGION.match(value):
                raise ConfigError(f"config {source}: [marketplace] region {value!r} is not an "
                                  "AWS region name; write e.g. region = \"us-east-1\", or \"\" to "
                                  "read it from the instance metadata service")
        elif key in ("endpoint_url", "imds_url"):
            _want_str(where, key, value, source, '"https://..."')
            if (value or key == "imds_url") and not value.startswith(("http://", "https://")):
                raise ConfigError(f"config {source}: [marketplace] {key} must be an http(s):// "
                                  f"URL, got {value!r}")
        elif key == "timeout_s":
            _want_number(where, key, value, source, "3")
    elif table == "runner":
        if key == "manage_mount":
            _want_bool(where, key, value, source)
        elif key in ("mount_timeout_s", "stop_timeout_s"):
            _want_number(where, key, value, source)
        elif key == "metrics_dir":
            _want_str(where, key, value, source, '"/run/s4fs/metrics"')
            if value and not value.startswith("/"):
                raise ConfigError(f"config {source}: [runner] metrics_dir must be an absolute "
                                  f"path or \"\", got {value!r}")


def _suggest(key: str, known: set[str]) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
