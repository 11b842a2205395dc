"""HTTPS on the HTTP port: vLLM's `--ssl-keyfile`, `--ssl-certfile`, `--ssl-ca-certs`,
`--ssl-cert-reqs` and `--ssl-ciphers` (read by startup/vllmserve.py), which vLLM hands to
uvicorn as these are handed here, to the uvicorn of the HTTP port (and of each HTTP
worker, which serves that port). The `--metrics-port` listener and the SageMaker and
Vertex AI ones stay plain, as Triton's; gRPC has Triton's own TLS flags.

The files are read once, when the command line is: a key that does not match its
certificate, or a file that does not open, is a usage error naming the flag, where
vLLM's server fails as it starts.
"""

from __future__ import annotations

import ssl
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class HttpTls:
    keyfile: str = ""
    certfile: str = ""
    ca_certs: str = ""
    # ssl.CERT_NONE (0), CERT_OPTIONAL (1) or CERT_REQUIRED (2): whether clients must
    # present a certificate that `ca_certs` signed (mutual TLS).
    cert_reqs: int = int(ssl.CERT_NONE)
    ciphers: str = ""

    @property
    def on(self) -> bool:
        return bool(self.certfile)

    def uvicorn_options(self) -> dict[str, Any]:
        """uvicorn.Config's keywords for HTTPS (none where it is off)."""
        if not self.on:
            return {}
        options: dict[str, Any] = {
            "ssl_certfile": self.certfile,
            "ssl_keyfile": self.keyfile or None,
            "ssl_ca_certs": self.ca_certs or None,
            "ssl_cert_reqs": self.cert_reqs,
        }
        if self.ciphers:
            options["ssl_ciphers"] = self.ciphers
        return options

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HttpTls:
        return cls(**data)
