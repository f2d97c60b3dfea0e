#!/usr/bin/env python3
"""A local S3 server for nixl-backend-gds tests and examples: moto on 127.0.0.1.

Starts moto's server on a free port (or --port), creates the buckets given with --bucket, and
with --auth enforces SigV4 authentication: an IAM user with full S3 access is created and its
generated key pair is the only one accepted. Prints one JSON line when ready:
  {"endpoint": "http://127.0.0.1:PORT", "access_key": "...", "secret_key": "...", "region": "us-east-1"}
then serves until stdin closes (so the server dies with the test that started it) or it is killed.
With --until-stdin-closes it also answers one command per stdin line, with one JSON line:
  uploads BUCKET    {"uploads": N}: multipart uploads started and neither completed nor aborted
"""
import argparse
import json
import sys
import threading

ACCOUNT = "123456789012"
REGION = "us-east-1"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--bucket", action="append", default=[])
    ap.add_argument("--auth", action="store_true")
    ap.add_argument("--until-stdin-closes", action="store_true")
    args = ap.parse_args()

    from moto import settings
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.s3.models import s3_backends

    access_key, secret_key = "testing", "testing"
    if args.auth:
        from moto.iam.models import iam_backends

        iam = iam_backends[ACCOUNT]["aws"]
        iam.create_user(REGION, "nixl-test")
        iam.put_user_policy(
            "nixl-test",
            "all-s3",
            json.dumps({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}),
        )
        key = iam.create_access_key("nixl-test")
        access_key, secret_key = key.access_key_id, key.secret_access_key
    for b in args.bucket:
        s3_backends[ACCOUNT]["aws"].create_bucket(b, REGION)

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=args.port, verbose=False)
    server.start()
    if args.auth:
        settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    host, port = server.get_host_and_port()
    print(json.dumps({"endpoint": f"http://{host}:{port}", "access_key": access_key, "secret_key": secret_key, "region": REGION}), flush=True)
    if args.until_stdin_closes:
        for line in sys.stdin:
            words = line.split()
            if len(words) == 2 and words[0] == "uploads":
                bucket = s3_backends[ACCOUNT]["aws"].buckets.get(words[1])
                n = len(bucket.multiparts) if bucket is not None else -1
                print(json.dumps({"uploads": n}), flush=True)
            else:
                print(json.dumps({"error": f"unknown command {line.strip()!r}"}), flush=True)
    else:
        threading.Event().wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
