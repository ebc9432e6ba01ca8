"""TLS for `edgeserve serve`, through uvicorn's own options: a certificate and key, and with a CA
bundle, client certificates required (mutual TLS). Checked before the model loads."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgeserve.errors import ConfigError

CERT_ENV, KEY_ENV, CA_ENV = (
    "EDGESERVE_SSL_CERTFILE",
    "EDGESERVE_SSL_KEYFILE",
    "EDGESERVE_SSL_CA_CERTS",
)


@dataclass(frozen=True)
class TlsFiles:
    certfile: str
    keyfile: str
    ca_certs: str | None = None

    @classmethod
    def resolve(
        cls,
        certfile: str | None,
        keyfile: str | None,
        ca_certs: str | None,
        environ: Mapping[str, str],
    ) -> TlsFiles | None:
        """The flags, else the EDGESERVE_SSL_* variables; None for plain HTTP. The pair is
        loaded once here, so a wrong path or a key that does not match fails in a second."""
        cert = certfile or environ.get(CERT_ENV)
        key = keyfile or environ.get(KEY_ENV)
        ca = ca_certs or environ.get(CA_ENV)
        if not (cert or key or ca):
            return None
        if not (cert and key):
            raise ConfigError(
                "TLS needs both --ssl-certfile and --ssl-keyfile "
                f"(or {CERT_ENV} and {KEY_ENV}); got only "
                + ("the certificate" if cert else "the key" if key else "a CA bundle")
            )
        files = cls(cert, key, ca)
        files.check()
        return files

    def check(self) -> None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(self.certfile, self.keyfile)
            if self.ca_certs:
                context.load_verify_locations(self.ca_certs)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"TLS files {self.certfile}, {self.keyfile}"
                + (f", {self.ca_certs}" if self.ca_certs else "")
                + f": {exc.strerror or exc}"
            ) from None

    def uvicorn_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"ssl_certfile": self.certfile, "ssl_keyfile": self.keyfile}
        if self.ca_certs:
            options |= {"ssl_ca_certs": self.ca_certs, "ssl_cert_reqs": ssl.CERT_REQUIRED}
        return options
