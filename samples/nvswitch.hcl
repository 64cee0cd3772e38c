# An NVSwitch server (DGX-2/HGX style): 8 GPUs, each with 150 GB/s per direction into one
# non-blocking NVSwitch fabric, modelled as a single forwarding-only switch.

topology nvswitch {
    node gpu[0..7]
    switch nvs
    gpu[0..7] <-> nvs : 150 GB/s, 1 us
}

collective broadcast = broadcast on nvswitch {
    root = gpu0
    size = 256 MB
}

collective allreduce = allreduce on nvswitch {
    size = 256 MB
    op   = sum
}

collective allgather = allgather on nvswitch {
    size = 128 MB
}

collective reduce_scatter = reduce_scatter on nvswitch {
    size = 128 MB
}

collective alltoall = alltoall on nvswitch {
    size = 128 MB                       # a multiple of 8 ranks x 4 B
}
