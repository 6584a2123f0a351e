"""relay.v1 from gRPC's C core (grpcio, default channel options), as a person's own client would call
it: an agent says Hello, holds its Subscribe stream open, and counts the pushes that arrive; or makes
serial Send calls with the stream open. Prints one JSON line with what happened.

usage: relay_client.py ADDRESS HANDLE receive COUNT SECONDS
       relay_client.py ADDRESS HANDLE send TO COUNT SECONDS
The machine token comes from RELAY_TOKEN. "subscribed" is printed once the push stream is open.
"""

import json
import os
import sys
import tempfile
import threading
import time

import grpc
from grpc_tools import protoc


def stubs():
    """relay.proto compiled for Python, into a directory of this run's."""
    proto_dir = os.path.join(os.path.dirname(__file__), "..", "..", "proto")
    out = tempfile.mkdtemp(prefix="relay-grpcio-")
    include = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    status = protoc.main(["protoc", f"-I{proto_dir}", f"-I{include}", f"--python_out={out}",
                          f"--grpc_python_out={out}", "relay/v1/relay.proto"])
    if status != 0:
        sys.exit(f"protoc failed: {status}")
    sys.path.insert(0, out)
    from relay.v1 import relay_pb2, relay_pb2_grpc  # noqa: E402
    return relay_pb2, relay_pb2_grpc


def main():
    address, handle, mode = sys.argv[1:4]
    pb, rpc = stubs()
    channel = grpc.insecure_channel(address)
    relay = rpc.RelayStub(channel)
    machine = [("authorization", "Bearer " + os.environ["RELAY_TOKEN"])]
    hello = relay.Hello(pb.HelloRequest(handle=handle, harness="other"), metadata=machine)
    session = [("authorization", "Bearer " + hello.session_token)]

    received = 0
    error = None
    done = threading.Event()
    expected = int(sys.argv[4]) if mode == "receive" else None

    pushes = relay.Subscribe(pb.SubscribeRequest(), metadata=session)

    def read():
        nonlocal received, error
        try:
            for push in pushes:
                if push.WhichOneof("event") == "message":
                    received += 1
                    if expected is not None and received >= expected:
                        done.set()
        except grpc.RpcError as e:
            if not done.is_set():
                error = f"{e.code().name}: {e.details()}"
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    print("subscribed", flush=True)

    sent = 0
    if mode == "receive":
        done.wait(float(sys.argv[5]))
    else:
        to, count, seconds = sys.argv[4], int(sys.argv[5]), float(sys.argv[6])
        deadline = time.monotonic() + seconds
        try:
            while sent < count and time.monotonic() < deadline and error is None:
                relay.Send(pb.SendRequest(to=[to], body=f"serial {sent}", client_id=f"{handle}-{sent}"),
                           metadata=session)
                sent += 1
        except grpc.RpcError as e:
            error = f"{e.code().name}: {e.details()}"
    stream_open = not done.is_set() or mode == "receive"
    pushes.cancel()
    print(json.dumps({"received": received, "sent": sent, "error": error, "stream_open": stream_open}), flush=True)


if __name__ == "__main__":
    main()
