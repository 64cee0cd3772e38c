# A 4-server cluster: each server has 8 GPUs on an NVSwitch and one 100 Gbit/s NIC per GPU
# (GPU i reaches NIC i over PCIe); every NIC connects to one top-of-rack switch.
# 32 ranks; the inter-server cut (8 x 12.5 GB/s per server) is what bounds allgather.

topology cluster {
    class pcie = 25 GB/s, 1 us          # PCIe 4.0 x16 between a GPU and its NIC

    host h[0..3] {
        node gpu[0..7]
        switch nvs                      # NVSwitch: 150 GB/s per GPU
        switch nic[0..7]                # NICs forward only
        gpu[0..7] <-> nvs : 150 GB/s, 1 us
        gpu0 <-> nic0 : pcie
        gpu1 <-> nic1 : pcie
        gpu2 <-> nic2 : pcie
        gpu3 <-> nic3 : pcie
        gpu4 <-> nic4 : pcie
        gpu5 <-> nic5 : pcie
        gpu6 <-> nic6 : pcie
        gpu7 <-> nic7 : pcie
    }
    switch tor
    h[0..3].nic[0..7] <-> tor : 100 Gbit/s, 5 us     # = 12.5 GB/s each
}

collective allgather = allgather on cluster {
    size = 256 MB
}

collective allreduce = allreduce on cluster {
    size = 256 MB
    op   = sum
}

collective broadcast = broadcast on cluster {
    root = h0.gpu0
    size = 256 MB
}

# one job on two servers: only their GPUs, the NVSwitches, the NICs and the ToR carry it
collective two_hosts_allreduce = allreduce on cluster {
    ranks = h[0..1].gpu[0..7]
    size  = 128 MB
}
