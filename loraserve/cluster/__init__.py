"""Scale-out on Ray Serve (`loraserve ray`): replicas that each run one loraserve server
(`replica`, the same `create_app` as `loraserve serve`, hosted in-process by `asgi_host`),
an HTTP ingress (`ingress`) that routes every request by its adapter cache key (`routing`)
and fans the global adapter endpoints out to every replica through one coordinator actor
(`coordinator`), whose answers `merge` combines; `app` binds them, `cli` starts them.

Ray is an optional extra: ``pip install -e '.[ray]'``.
"""

INSTALL_HINT = (
    "loraserve ray needs Ray Serve, an optional extra: pip install 'loraserve[ray]' "
    "(from a checkout: pip install -e '.[ray]')"
)
