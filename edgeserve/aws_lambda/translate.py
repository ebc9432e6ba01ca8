"""botocore's exceptions as DeployErrors: which step failed, and what to do about it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from edgeserve.aws_lambda.settings import LambdaSettings
from edgeserve.errors import DeployError


@contextmanager
def translated(name: str, settings: LambdaSettings, step: str) -> Iterator[None]:
    """botocore's exceptions -> DeployError saying which step failed and what to do."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, WaiterError

    where = f"lambda {name} ({settings.region}), step {step!r}"
    try:
        yield
    except NoCredentialsError:
        raise DeployError(
            f"{where}: no AWS credentials found. Hint: set AWS_PROFILE, or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or run `aws configure`"
        ) from None
    except ClientError as exc:
        raise DeployError(f"{where}: {_hint(exc.response, settings)}") from None
    except WaiterError as exc:
        raise DeployError(f"{where}: the function did not settle: {exc}") from None
    except BotoCoreError as exc:
        raise DeployError(
            f"{where}: {exc}. Hint: check that region {settings.region!r} exists and is reachable"
        ) from None


def _hint(response: dict[str, Any], settings: LambdaSettings) -> str:
    error = response.get("Error", {})
    code, message = error.get("Code", "?"), error.get("Message", "")
    hints = {
        "UnrecognizedClientException": "the credentials are not valid in this region; check them",
        "InvalidSignatureException": "the secret key does not match; check the credentials",
        "AccessDeniedException": "these credentials may not do this; grant them lambda:*",
        "ResourceNotFoundException": f"not in {settings.region}; deploy first, or check region",
    }
    if code == "InvalidParameterValueException" and "role" in message.lower():
        hint = f"role {settings.resolved_role()!r} cannot be assumed by Lambda; check role_arn"
    else:
        hint = hints.get(code, "see the message")
    return f"{code}: {message.rstrip('.')}. Hint: {hint}"
