# 64 DGX-1 servers (V100) on a 100 Gbit/s fabric: 512 ranks.
# Inside a server: the hybrid cube-mesh of NVLinks (samples/dgx1.hcl) and four PCIe switches,
# each holding two GPUs and one 100 Gbit/s EDR InfiniBand NIC, as on the real machine
# (GPUs 0-1 with NIC 0, 2-3 with NIC 1, ...). Every NIC is one port of a non-blocking fabric
# switch, so a server reaches the others at 4 x 12.5 = 50 GB/s each way: the fabric, not
# NVLink (150 GB/s per GPU), bounds every collective that spans servers.

topology dgx1x64 {
    class nvlink = 25 GB/s, 1 us        # one NVLink 2.0 brick, per direction
    class pcie   = 12 GB/s, 2 us        # PCIe 3.0 x16 as measured
    class edr    = 100 Gbit/s, 5 us     # EDR InfiniBand port, switch hop included

    host dgx[0..63] {
        node gpu[0..7]
        switch pcie[0..3]               # PCIe switches: forward only, never own data
        switch nic[0..3]                # the NICs forward only

        # the hybrid cube-mesh of samples/dgx1.hcl
        gpu0 <-> gpu[1,4] : nvlink x2    gpu1 <-> gpu3 : nvlink x2    gpu2 <-> gpu[3,6] : nvlink x2
        gpu4 <-> gpu5 : nvlink x2        gpu5 <-> gpu7 : nvlink x2    gpu6 <-> gpu7 : nvlink x2
        gpu0 <-> gpu[2,3] : nvlink       gpu1 <-> gpu[2,5] : nvlink   gpu3 <-> gpu7 : nvlink
        gpu4 <-> gpu[6,7] : nvlink       gpu5 <-> gpu6 : nvlink

        gpu[0..1] <-> pcie0 : pcie    gpu[2..3] <-> pcie1 : pcie    # two GPUs to each PCIe switch
        gpu[4..5] <-> pcie2 : pcie    gpu[6..7] <-> pcie3 : pcie
        pcie0 <-> nic0 : pcie         pcie1 <-> nic1 : pcie         # and one NIC
        pcie2 <-> nic2 : pcie         pcie3 <-> nic3 : pcie
    }
    switch fabric
    dgx[0..63].nic[0..3] <-> fabric : edr
}

collective allreduce = allreduce on dgx1x64 { size = 256 MiB }
collective allgather = allgather on dgx1x64 { size = 256 MiB }
collective broadcast = broadcast on dgx1x64 { root = dgx0.gpu0  size = 256 MiB }
