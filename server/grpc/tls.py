"""--grpc-use-ssl's certificate, key and root, as the server's gRPC front end and each
gRPC worker serve them."""

from __future__ import annotations

from dataclasses import dataclass

import grpc


@dataclass(frozen=True, slots=True)
class GrpcTls:
    """--grpc-use-ssl: the server's PEM certificate and key; with `mutual`, clients must
    present a certificate that `root` signed."""

    cert: bytes
    key: bytes
    root: bytes | None = None
    mutual: bool = False

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.root, require_client_auth=self.mutual
        )
