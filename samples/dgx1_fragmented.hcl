# Fragmented DGX-1 allocations, as a shared cluster's scheduler hands them out (Blink, MLSys
# 2020, fig. 2): the GPUs of one job are not a clean NVLink ring, and GPUs of other jobs must
# not forward its data. Only the job's GPUs and the PCIe switches carry it.

topology dgx1 {
    node gpu[0..7]
    switch pcie0, pcie1

    class nvlink = 25 GB/s, 1 us
    class pcie   = 12 GB/s, 2 us
    class qpi    = 10 GB/s, 3 us

    # the hybrid cube-mesh of samples/dgx1.hcl
    gpu0 <-> gpu[1,4] : nvlink x2    gpu1 <-> gpu3 : nvlink x2    gpu2 <-> gpu[3,6] : nvlink x2
    gpu4 <-> gpu5 : nvlink x2        gpu5 <-> gpu7 : nvlink x2    gpu6 <-> gpu7 : nvlink x2
    gpu0 <-> gpu[2,3] : nvlink       gpu1 <-> gpu[2,5] : nvlink   gpu3 <-> gpu7 : nvlink
    gpu4 <-> gpu[6,7] : nvlink       gpu5 <-> gpu6 : nvlink

    gpu[0..3] <-> pcie0 : pcie
    gpu[4..7] <-> pcie1 : pcie
    pcie0 <-> pcie1 : qpi
}

# gpu6 has no NVLink to the other three: its data must cross PCIe and QPI
collective alloc_0136_broadcast = broadcast on dgx1 {
    ranks = gpu[0,1,3,6]
    root  = gpu0
    size  = 500 MB
}

collective alloc_0136_allreduce = allreduce on dgx1 {
    ranks = gpu[0,1,3,6]
    size  = 100 MB
}

collective alloc_2367_allreduce = allreduce on dgx1 {
    ranks = gpu[2,3,6,7]
    size  = 100 MB
}

collective alloc_04567_broadcast = broadcast on dgx1 {
    ranks = gpu[0,4..7]
    size  = 500 MB
}

collective alloc_04567_allgather = allgather on dgx1 {
    ranks = gpu[0,4..7]
    size  = 64 MB
}

collective alloc_123_allreduce = allreduce on dgx1 {
    ranks = gpu1, gpu2, gpu3
    size  = 100 MB
}

collective alloc_157_reduce = reduce on dgx1 {
    ranks = gpu[1,5,7]
    root  = gpu5
    size  = 100 MB
}
