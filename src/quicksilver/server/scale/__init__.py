"""Scale-out: Ray Serve replicas and their routers, prefix-aware routing keys, tensor-parallel ranks."""
