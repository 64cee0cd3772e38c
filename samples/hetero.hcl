# Heterogeneous networks where one link is 10x slower than the others: a ring algorithm runs
# at the speed of its slowest hop, a tree packing routes around it.

# four nodes, fully meshed at 10 GB/s, except n0 <-> n1 at 1 GB/s
topology mesh {
    node n[0..3]
    class fast = 10 GB/s, 2 us
    class slow = 1 GB/s, 20 us
    n0 <-> n1 : slow
    n0 <-> n[2,3] : fast
    n1 <-> n[2,3] : fast
    n2 <-> n3 : fast
}

# six nodes in a ring at 10 GB/s, except n5 <-> n0 at 1 GB/s
topology ring6 {
    node n[0..5]
    n0 <-> n1 : 10 GB/s, 2 us
    n1 <-> n2 : 10 GB/s, 2 us
    n2 <-> n3 : 10 GB/s, 2 us
    n3 <-> n4 : 10 GB/s, 2 us
    n4 <-> n5 : 10 GB/s, 2 us
    n5 <-> n0 : 1 GB/s, 20 us
}

collective mesh_allreduce = allreduce on mesh  { size = 64 MB }
collective mesh_broadcast = broadcast on mesh  { root = n0  size = 64 MB }
collective mesh_allgather = allgather on mesh  { size = 64 MB }
collective ring_allreduce = allreduce on ring6 { size = 64 MB }
collective ring_broadcast = broadcast on ring6 { root = n0  size = 64 MB }
