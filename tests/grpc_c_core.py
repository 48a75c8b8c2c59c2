"""A CRI client on gRPC's C core (Python grpcio, as installed by hack/install-test-deps.sh): it
dials the socket the way such clients do by default (`unix:///path`, percent-encoded path as
:authority) and makes several calls on one channel, so later ones send the authority from the
HPACK dynamic table. Requests are empty messages; prints one line per answer."""
import sys

import grpc

channel = grpc.insecure_channel("unix://" + sys.argv[1])
ident = lambda b: b
for i in range(3):
    for method in (
        "/runtime.v1.RuntimeService/Version",
        "/runtime.v1.RuntimeService/Status",
        "/runtime.v1.RuntimeService/ListPodSandbox",
        "/runtime.v1.ImageService/ListImages",
    ):
        call = channel.unary_unary(method, request_serializer=ident, response_deserializer=ident)
        answer = call(b"", timeout=10)
        print(method, len(answer))
version = channel.unary_unary(
    "/runtime.v1.RuntimeService/Version", request_serializer=ident, response_deserializer=ident
)(b"", timeout=10)
assert b"crius" in version, version
print("grpcio", grpc.__version__, "ok")
