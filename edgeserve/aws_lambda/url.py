"""A function's URL on its alias: made as the profile's `url_auth_type` asks, open to everyone
for AuthType NONE, and put back as it was when a deploy fails.

The app answers CORS itself (http/cors.py), so the URL of a function with CORS origins must
have no `Cors` setting: Lambda would add its own Access-Control-Allow-Origin beside the app's
(browsers refuse an answer with two) and answer preflights in the app's place. A `Cors` put on
the URL by hand is removed at deploy, with a warning saying what it held, since the function's
own [cors] is what its owner asked for: an update without `Cors` keeps it, an empty one clears
it. A function without origins keeps the URL's `Cors`: there it is the only answer.
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger("edgeserve")

URL_STATEMENTS = (
    ("edgeserve-url", {"Action": "lambda:InvokeFunctionUrl", "FunctionUrlAuthType": "NONE"}),
    ("edgeserve-url-invoke", {"Action": "lambda:InvokeFunction", "InvokedViaFunctionUrl": True}),
)
"""A public URL (AuthType NONE) needs both statements (functions with URLs since Oct 2025)."""


def found(client: Any, call: Any, **kwargs: Any) -> dict[str, Any] | None:
    """What a Lambda API read returns, None where it finds nothing."""
    try:
        answer: dict[str, Any] = call(**kwargs)
    except client.exceptions.ResourceNotFoundException:
        return None
    return answer


class FunctionUrl:
    """The URL of one function's alias and the statements that make it public."""

    def __init__(self, client: Any, name: str, alias: str) -> None:
        self.client = client
        self.target = {"FunctionName": name, "Qualifier": alias}

    def ensure(self, auth: str, own_cors: bool) -> str:
        """The URL with AuthType `auth`, everyone's permissions only for NONE, and no `Cors`
        where the app answers CORS itself (`own_cors`)."""
        config = self.config()
        if config is None:
            url: str = self.client.create_function_url_config(**self.target, AuthType=auth)[
                "FunctionUrl"
            ]
        else:
            cleared: dict[str, Any] = {"Cors": {}} if own_cors and config.get("Cors") else {}
            if cleared:
                log.warning(
                    "lambda %s: removed the function URL's Cors setting %s: the function "
                    "answers CORS itself ([cors] origins), and browsers refuse two "
                    "Access-Control-Allow-Origin values",
                    self.target["FunctionName"],
                    json.dumps(config["Cors"]),
                )
            update = self.client.update_function_url_config
            url = update(**self.target, AuthType=auth, **cleared)["FunctionUrl"]
        if auth == "NONE":
            self.allow_public(URL_STATEMENTS)
        else:
            self.revoke_public()
        return url

    def remove(self) -> None:
        """No URL (`url_auth_type = "off"`), nor its public statements."""
        self.revoke_public()
        if self.config() is not None:
            self.client.delete_function_url_config(**self.target)

    def restore(self, before: dict[str, Any] | None, granted: frozenset[str]) -> None:
        """The URL as `before` (its config, None: no URL) had it, with the statements
        `granted` then."""
        now = self.config()
        if before is None and now is not None:
            self.client.delete_function_url_config(**self.target)
        elif before is not None:
            auth, cors = before["AuthType"], before.get("Cors") or {}
            if now is None:
                made = {"Cors": cors} if cors else {}
                self.client.create_function_url_config(**self.target, AuthType=auth, **made)
            elif (now["AuthType"], now.get("Cors") or {}) != (auth, cors):
                self.client.update_function_url_config(**self.target, AuthType=auth, Cors=cors)
        now_granted = self.granted()
        for statement_id in now_granted - granted:
            self.client.remove_permission(**self.target, StatementId=statement_id)
        taken = granted - now_granted
        self.allow_public(tuple(entry for entry in URL_STATEMENTS if entry[0] in taken))

    def allow_public(self, statements: tuple[tuple[str, dict[str, Any]], ...]) -> None:
        granted = self.granted()
        for statement_id, statement in statements:
            if statement_id not in granted:
                self.client.add_permission(
                    **self.target, StatementId=statement_id, Principal="*", **statement
                )

    def revoke_public(self) -> None:
        """Take back the statements a public URL added (a URL no longer public, or none)."""
        for statement_id in self.granted() & {statement_id for statement_id, _ in URL_STATEMENTS}:
            self.client.remove_permission(**self.target, StatementId=statement_id)

    def config(self) -> dict[str, Any] | None:
        return found(self.client, self.client.get_function_url_config, **self.target)

    def url(self) -> str | None:
        config = self.config()
        return config["FunctionUrl"] if config else None

    def granted(self) -> frozenset[str]:
        """The statement ids of the alias's resource policy."""
        policy = found(self.client, self.client.get_policy, **self.target)
        statements = json.loads(policy["Policy"])["Statement"] if policy else []
        return frozenset(statement.get("Sid", "") for statement in statements)
