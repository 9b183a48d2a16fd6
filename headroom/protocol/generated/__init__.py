"""Code generated from ../proto by headroom/protocol/gen_grpc.py; do not edit."""
