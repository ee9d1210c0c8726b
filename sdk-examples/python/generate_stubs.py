#!/usr/bin/env python3
"""Generates the Python gRPC stubs for HiveKernel from proto/ into ./generated.

Run it once after installing requirements.txt (the examples also run it on
first use, and again whenever the .proto files change):

    python generate_stubs.py
"""

import hashlib
import os
import pathlib
import shutil
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto" / "proto"
OUT = HERE / "generated"
STAMP = OUT / ".proto-sha256"


def proto_files():
    return sorted(PROTO_ROOT.rglob("*.proto"))


def proto_digest():
    digest = hashlib.sha256()
    for path in proto_files():
        digest.update(str(path.relative_to(PROTO_ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def up_to_date():
    return STAMP.is_file() and STAMP.read_text().strip() == proto_digest()


def generate():
    """Writes fresh stubs to ./generated, replacing it as a whole."""
    try:
        from grpc_tools import protoc
    except ImportError:
        sys.exit(
            "grpcio-tools is not installed: run `pip install -r requirements.txt` "
            f"(in {HERE}) first"
        )
    import grpc_tools

    well_known = pathlib.Path(grpc_tools.__file__).resolve().parent / "_proto"
    digest = proto_digest()
    # Built beside the target and renamed into place, so a reader never sees half a tree.
    staging = pathlib.Path(tempfile.mkdtemp(prefix=".generated-", dir=HERE))
    try:
        args = [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{well_known}",
            f"--python_out={staging}",
            f"--grpc_python_out={staging}",
        ] + [str(path.relative_to(PROTO_ROOT)) for path in proto_files()]
        if protoc.main(args) != 0:
            sys.exit("protoc failed; see the messages above")
        (staging / ".proto-sha256").write_text(digest + "\n")
        old = None
        if OUT.exists():
            old = HERE / f".generated-old-{os.getpid()}"
            try:
                OUT.rename(old)
            except FileNotFoundError:
                # Another run moved it away first.
                old = None
        try:
            staging.rename(OUT)
        except OSError:
            # Another run put a tree in place first; theirs is as good.
            pass
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def ensure():
    """Generates the stubs unless they match the .proto files already."""
    if not up_to_date():
        generate()


if __name__ == "__main__":
    generate()
    print(f"stubs written to {OUT}")
