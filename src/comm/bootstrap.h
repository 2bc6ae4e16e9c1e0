// How a multi-process job finds itself: rank, world size and local rank from the launcher's
// environment (torchrun, OpenMPI or Slurm), and a small TCP rendezvous in which rank 0 hands
// every other rank the 128-byte NCCL unique id.
#pragma once

#include <array>
#include <chrono>
#include <functional>
#include <string>

namespace gpulab::comm {

// ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES), kept as plain bytes so this header needs no NCCL.
using UniqueId = std::array<char, 128>;

struct JobEnv {
  int rank = 0;
  int world = 1;
  int local_rank = 0;       // selects the GPU on this node
  std::string master_addr;  // rank 0's host; empty when world == 1
  int master_port = 0;
  std::string launcher = "none";  // torchrun, openmpi, slurm or none (a single process)
};

// Reads the job from `getenv` (the process environment by default), in this order:
//   torchrun style  RANK, WORLD_SIZE, LOCAL_RANK (default: RANK), MASTER_ADDR, MASTER_PORT
//   OpenMPI         OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//   Slurm           SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID (in an srun step only: an sbatch
//                   script's own process is not a rank)
// Under OpenMPI and Slurm MASTER_ADDR/MASTER_PORT are still read; a job on one node may leave
// MASTER_ADDR out (127.0.0.1), and MASTER_PORT defaults to 29500 (Slurm: derived from the job id,
// so two jobs sharing a node do not collide). Under torchrun, whose agent already serves a store
// on MASTER_PORT, the rendezvous takes MASTER_PORT + 1; GPULAB_MASTER_PORT overrides any of these.
// No variables at all: a single process.
// Throws core::InputError naming the variable for missing, malformed or inconsistent values.
using GetEnv = std::function<const char*(const char*)>;
JobEnv job_from_env(const GetEnv& getenv);
JobEnv job_from_env();

// The rendezvous. Rank 0 listens on job.master_port (every interface), waits until all other
// ranks have connected, then sends each the id from `make_id`, which it also returns. Other
// ranks connect to master_addr:master_port, retrying until `timeout`, and return the id they
// receive. Nothing happens for world == 1 (the id is make_id()'s). Throws core::Error naming the
// address (and, on rank 0, the ranks that never came) when the timeout passes, and
// core::InputError when the port cannot be listened on or a peer disagrees on the world size.
UniqueId rendezvous(const JobEnv& job, std::chrono::milliseconds timeout, const std::function<UniqueId()>& make_id);

// "2.5 s", for messages about timeouts.
std::string seconds_text(std::chrono::milliseconds t);

}  // namespace gpulab::comm
