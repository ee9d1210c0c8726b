"""Small helpers shared by the HiveKernel Python examples.

- stubs(): the generated messages (pb) and service stub module (rpc),
  generating them from proto/ first if needed;
- connect(addr, token, tls): a Kernel stub whose every call carries
  `authorization: Bearer <token>`, over TLS when `tls` credentials are given;
- address() / token() / tls_credentials(): where the kernel is, the
  credential to use and what to trust, from flags, the environment
  (HIVEKERNEL_ADDR, HIVEKERNEL_TOKEN, HIVEKERNEL_TLS_*) or the kernel's data
  directory (kernel.addr, admin.token, tls-ca.pem).
"""

import collections
import os
import pathlib
import sys

import grpc

import generate_stubs

DEFAULT_ADDR = "127.0.0.1:50051"


def stubs():
    """(pb, rpc): the hivekernel.v1 messages and the Kernel service stubs."""
    generate_stubs.ensure()
    generated = str(generate_stubs.OUT)
    if generated not in sys.path:
        sys.path.insert(0, generated)
    from hivekernel.v1 import kernel_pb2, kernel_pb2_grpc

    return kernel_pb2, kernel_pb2_grpc


def _raw_address(flag, data_dir):
    addr = flag or os.environ.get("HIVEKERNEL_ADDR")
    if not addr:
        path = pathlib.Path(data_dir) / "kernel.addr"
        addr = path.read_text().strip() if path.is_file() else DEFAULT_ADDR
    return addr


def address(flag=None, data_dir=".hivekernel"):
    """The kernel's host:port: the flag, HIVEKERNEL_ADDR, <data_dir>/kernel.addr, or the default."""
    addr = _raw_address(flag, data_dir)
    # grpcio wants host:port, not a URL.
    for scheme in ("http://", "https://"):
        if addr.startswith(scheme):
            addr = addr[len(scheme):]
    return addr.rstrip("/")


def token(flag=None, data_dir=".hivekernel"):
    """The bearer token: the flag, HIVEKERNEL_TOKEN, or <data_dir>/admin.token."""
    value = flag or os.environ.get("HIVEKERNEL_TOKEN")
    if value:
        return value.strip()
    path = pathlib.Path(data_dir) / "admin.token"
    try:
        return path.read_text().strip()
    except OSError as err:
        sys.exit(
            f"no token: pass --token, set HIVEKERNEL_TOKEN, or point --data-dir at the "
            f"kernel's data directory ({path}: {err.strerror})"
        )


class _Details(
    collections.namedtuple(
        "_Details",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the bearer token to every call."""

    def __init__(self, value):
        self._header = ("authorization", f"Bearer {value}")

    def _with_token(self, details):
        metadata = list(details.metadata or []) + [self._header]
        return _Details(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)


def tls_credentials(flag=None, data_dir=".hivekernel"):
    """TLS channel credentials for the kernel, or None when it speaks plain text.

    TLS is on when HIVEKERNEL_TLS_CA is set (the kernel gives it to its exec
    agents) or the address (flag, HIVEKERNEL_ADDR, kernel.addr) is https://.
    The server is trusted by HIVEKERNEL_TLS_CA, else <data_dir>/tls-ca.pem;
    HIVEKERNEL_TLS_CERT and HIVEKERNEL_TLS_KEY add a client certificate, for a
    kernel that requires one (mutual TLS).
    """
    ca = os.environ.get("HIVEKERNEL_TLS_CA")
    if not ca and not _raw_address(flag, data_dir).startswith("https://"):
        return None
    ca = pathlib.Path(ca or pathlib.Path(data_dir) / "tls-ca.pem")
    cert, key = os.environ.get("HIVEKERNEL_TLS_CERT"), os.environ.get("HIVEKERNEL_TLS_KEY")
    try:
        roots = ca.read_bytes()
        chain = pathlib.Path(cert).read_bytes() if cert else None
        private = pathlib.Path(key).read_bytes() if key else None
    except OSError as err:
        sys.exit(f"cannot read {err.filename}: {err.strerror} (HIVEKERNEL_TLS_CA, _CERT, _KEY)")
    return grpc.ssl_channel_credentials(
        root_certificates=roots, private_key=private, certificate_chain=chain
    )


def connect(addr, bearer, tls=None):
    """A hivekernel.v1.Kernel stub on a channel to addr (TLS with `tls` credentials,
    else plain text), sending `bearer` on every call."""
    _, rpc = stubs()
    if tls is None:
        channel = grpc.insecure_channel(addr)
    else:
        channel = grpc.secure_channel(addr, tls)
    channel = grpc.intercept_channel(channel, _Bearer(bearer))
    return rpc.KernelStub(channel)
