#!/usr/bin/env bash
# Debian packages the test suite needs: a real sshd and rsync (Jetson deploy tests), the fonts
# the OCR evaluation and tests render with (fonts-b612: a receipt's monospaced design), libb64
# for perf_analyzer (tritonclient 2.41.0's binary), and
# podman (runc, catatonit for pods), debootstrap (the test base image) and docker-registry (a
# local OCI registry) for the image tests, and chromium (the /docs page, loaded headless).
# Installs only what is missing; needs root or sudo.
set -euo pipefail
packages=(openssh-server openssh-client rsync fontconfig fonts-dejavu-core fonts-liberation
  fonts-b612 libb64-0d podman runc catatonit debootstrap docker-registry chromium)
if [ -f functions/ocr/training/apt-packages.txt ]; then
  mapfile -t -O "${#packages[@]}" packages < <(grep -v '^#' functions/ocr/training/apt-packages.txt)
fi
missing=()
for p in "${packages[@]}"; do
  [ -n "$p" ] && ! dpkg -s "$p" >/dev/null 2>&1 && missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
