"""AWS Marketplace entitlement: ``RegisterUsage`` once at boot, fail-closed.

:func:`register_usage` finds the region (the config, else IMDSv2: a token ``PUT``, then a
``GET`` of ``placement/region``, each with a short timeout), calls
``meteringmarketplace.RegisterUsage`` and returns a :class:`Registration`. Every failure —
an error code from the API, no network, no credentials, no instance metadata — raises
:class:`EntitlementError`, whose message says what to do and whose ``transient`` flag tells
the runner whether a restart may help (throttling, outages) or not (not subscribed, a wrong
product code).

Note: AWS documents RegisterUsage for container products on Amazon ECS, EKS and Fargate;
elsewhere it answers ``PlatformNotSupportedException`` (see docs/DEPLOY.md).
"""

from __future__ import annotations

import logging
import re
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass

from s4fs.errors import S4Error

log = logging.getLogger(__name__)

_REGION = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d+$")

#: what each documented RegisterUsage error means for the operator, and whether retrying
#: later can help
ERRORS: dict[str, tuple[bool, str]] = {
    "CustomerNotEntitledException": (False, (
        "this AWS account is not subscribed to the s4fs product {product} in AWS Marketplace; "
        "subscribe to it (or set [marketplace] enabled = false when this is not the "
        "Marketplace edition)")),
    "DisabledApiException": (False, (
        "the AWS Marketplace Metering API is disabled for this account; ask AWS support to "
        "enable it")),
    "InternalServiceErrorException": (True, (
        "AWS Marketplace had an internal error; the service is restarted and tries again")),
    "InvalidProductCodeException": (False, (
        "product code {product} is not valid; set [marketplace] product_code to the code "
        "of the listing")),
    "InvalidPublicKeyVersionException": (False, (
        "public key version {key_version} is not valid; set [marketplace] public_key_version "
        "to the version given with the listing (usually 1)")),
    "InvalidRegionException": (False, (
        "RegisterUsage cannot be called in region {region}; run in a region where the "
        "product is offered, or fix [marketplace] region")),
    "PlatformNotSupportedException": (False, (
        "AWS Marketplace does not meter usage from this platform (RegisterUsage supports "
        "Amazon ECS, EKS and Fargate); run the Marketplace edition there, or set "
        "[marketplace] enabled = false")),
    "ThrottlingException": (True, (
        "AWS Marketplace throttled the call; the service is restarted and tries again")),
    # not in RegisterUsage's model, but what a missing IAM permission looks like
    "AccessDeniedException": (False, (
        "the instance role may not call RegisterUsage; allow aws-marketplace:RegisterUsage "
        "in its policy")),
}


class EntitlementError(S4Error):
    """RegisterUsage did not confirm the entitlement; the runner must not start."""

    def __init__(self, message: str, *, code: str, transient: bool) -> None:
        super().__init__(message)
        self.code = code
        self.transient = transient


@dataclass(frozen=True)
class Registration:
    region: str
    nonce: str
    signature: str
    public_key_rotation_timestamp: str

    def describe(self) -> str:
        return (f"RegisterUsage accepted in {self.region} "
                f"(public key rotation {self.public_key_rotation_timestamp or '-'})")


def imds_region(base_url: str = "http://169.254.169.254", timeout_s: float = 2.0) -> str:
    """The instance's region from the EC2 instance metadata service, IMDSv2 only."""
    base = base_url.rstrip("/")
    where = f"the instance metadata service (IMDSv2) at {base}"
    advice = ("set [marketplace] region in the config, or make sure instance metadata is "
              "enabled (HttpEndpoint enabled, HttpPutResponseHopLimit large enough for "
              "where s4fs runs)")
    try:
        req = urllib.request.Request(f"{base}/latest/api/token", method="PUT",
                                     headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            token = resp.read().decode("ascii", "replace").strip()
        req = urllib.request.Request(f"{base}/latest/meta-data/placement/region",
                                     headers={"X-aws-ec2-metadata-token": token})
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            region = resp.read().decode("ascii", "replace").strip()
    except urllib.error.HTTPError as exc:
        raise EntitlementError(f"could not read the region from {where}: HTTP {exc.code} "
                               f"{exc.reason}; {advice}", code="IMDS", transient=True) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EntitlementError(f"could not read the region from {where}: {reason}; {advice}",
                               code="IMDS", transient=True) from None
    if not _REGION.match(region):
        raise EntitlementError(f"{where} returned {region[:60]!r}, not a region name; {advice}",
                               code="IMDS", transient=True)
    return region


def metering_client(region: str, endpoint_url: str = "", timeout_s: float = 3.0):
    """A boto3 ``meteringmarketplace`` client with short timeouts and few retries."""
    try:
        import boto3
        from botocore.config import Config
    except ModuleNotFoundError:
        raise EntitlementError("the Marketplace check needs boto3: pip install 's4fs[service]'",
                               code="NoBoto3", transient=False) from None
    cfg = Config(connect_timeout=timeout_s, read_timeout=max(timeout_s, 10.0),
                 retries={"max_attempts": 3, "mode": "standard"})
    return boto3.client("meteringmarketplace", region_name=region,
                        endpoint_url=endpoint_url or None, config=cfg)


def register_usage(settings, *, client=None, nonce: str | None = None) -> Registration:
    """Call RegisterUsage for ``settings`` (a :class:`s4fs.config.MarketplaceConfig`).
    ``client`` replaces the boto3 client (tests stub it). Raises EntitlementError."""
    product, key_version = settings.product_code, settings.public_key_version
    region = settings.region or imds_region(settings.imds_url, settings.timeout_s)
    if client is None:
        client = metering_client(region, settings.endpoint_url, settings.timeout_s)
    nonce = nonce or str(uuid.uuid4())
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
    try:
        resp = client.register_usage(ProductCode=product, PublicKeyVersion=key_version,
                                     Nonce=nonce)
    except ClientError as exc:
        err = exc.response.get("Error", {})
        code = err.get("Code", "Unknown")
        request_id = exc.response.get("ResponseMetadata", {}).get("RequestId", "-")
        transient, advice = ERRORS.get(code, (_is_5xx(exc), "RegisterUsage failed"))
        advice = advice.format(product=product, key_version=key_version, region=region)
        raise EntitlementError(f"AWS Marketplace RegisterUsage refused: {code}: {advice} "
                               f"(AWS said: {err.get('Message') or '-'}; request id {request_id})",
                               code=code, transient=transient) from None
    except NoCredentialsError:
        raise EntitlementError("AWS Marketplace RegisterUsage: no AWS credentials; attach an "
                               "instance profile whose role allows aws-marketplace:RegisterUsage",
                               code="NoCredentials", transient=True) from None
    except BotoCoreError as exc:
        raise EntitlementError(f"AWS Marketplace RegisterUsage could not be reached in {region}: "
                               f"{exc}; check the network route to the Marketplace Metering "
                               "endpoint (NAT or an interface VPC endpoint)",
                               code=type(exc).__name__, transient=True) from None
    stamp = resp.get("PublicKeyRotationTimestamp")
    return Registration(region=region, nonce=nonce, signature=resp.get("Signature", ""),
                        public_key_rotation_timestamp=stamp.isoformat() if hasattr(stamp, "isoformat")
                        else str(stamp or ""))


def _is_5xx(exc) -> bool:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return status >= 500


__all__ = ["EntitlementError", "Registration", "register_usage", "imds_region",
           "metering_client", "ERRORS"]
