#!/usr/bin/env bash
# The Debian packages the network-namespace test bed (scripts/testbed.py) and its tests need. Idempotent:
# installs only what is missing, with one `apt-get update` and only then. Not root and something missing:
# says what is missing and exits 1.
#
#   --dev   also mpicc (libopenmpi-dev, gcc), for the test that sends MPI messages between namespace hosts
#           (skipped without it; libopenmpi-dev pulls in gfortran, hence optional)
set -euo pipefail

PACKAGES=(
  slurm-wlm     # slurmctld, slurmd, sinfo/srun/sbatch/scancel
  munge         # munged, Slurm's authentication
  openmpi-bin   # mpirun, orted
  iproute2      # ip: namespaces, bridge, veth
  util-linux    # nsenter, unshare (slurmctld runs in a UTS namespace named after SlurmctldHost)
  iputils-ping  # ping between namespace hosts in the tests
  openssh-server  # sshd in every namespace host (launcher=ssh's tests)
  openssh-client  # ssh, ssh-keygen: launcher=ssh, and the bed's keys
  etcd-server   # etcd: where a launcher=manual job that outlives its hosts decides who goes on (a member per host)
)
if [ "${1:-}" = "--dev" ]; then
  PACKAGES+=(libopenmpi-dev gcc)
elif [ $# -gt 0 ]; then
  echo "usage: $0 [--dev]" >&2
  exit 2
fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for p in "${PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "system packages: all present (${PACKAGES[*]})"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing Debian packages: ${missing[*]}" >&2
  echo "install them as root: sudo $0 $*" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "system packages: installed ${missing[*]}"
