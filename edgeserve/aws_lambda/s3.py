"""A zip over Lambda's 50 MB inline limit goes to S3 first, and the function's code names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeserve.aws_lambda.settings import LambdaSettings
from edgeserve.aws_lambda.translate import translated


def upload_to_s3(archive: Path, settings: LambdaSettings, key: str) -> dict[str, Any]:
    """Put a large zip in S3 (the profile's bucket, else one per account and region, created
    when missing) and name it as the function's code."""
    import boto3

    endpoint, region = settings.resolved_endpoint(), settings.region
    s3 = boto3.client("s3", region_name=region, endpoint_url=endpoint)
    with translated(archive.name, settings, "upload to S3"):
        bucket = settings.code_bucket or _default_bucket(region, endpoint)
        if not _bucket_exists(s3, bucket):
            s3.create_bucket(Bucket=bucket, **_location(region))
        s3.upload_file(str(archive), bucket, key)
    return {"S3Bucket": bucket, "S3Key": key}


def _default_bucket(region: str, endpoint: str | None) -> str:
    import boto3

    sts = boto3.client("sts", region_name=region, endpoint_url=endpoint)
    return f"edgeserve-code-{sts.get_caller_identity()['Account']}-{region}"


def _location(region: str) -> dict[str, Any]:
    """us-east-1 is S3's default and refuses to be named as a LocationConstraint."""
    if region == "us-east-1":
        return {}
    return {"CreateBucketConfiguration": {"LocationConstraint": region}}


def _bucket_exists(s3: Any, bucket: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchBucket", "NotFound"):
            return False
        raise
    return True
