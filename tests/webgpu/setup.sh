#!/usr/bin/env bash
# A software Vulkan driver for onnxruntime's WebGPU provider on a machine without a GPU.
#
#   bash tests/webgpu/setup.sh DEST
#
# Downloads Mesa's lavapipe (Mesa 25 from bookworm-backports: Dawn refuses bookworm's 22.3) and the
# Vulkan loader as Debian packages, unpacks them into DEST (nothing is installed system-wide) and
# writes DEST/env, which a shell sources before running offloadctl with --device webgpu:
#
#   . DEST/env && offloadctl run model.onnx --device webgpu
#
# On a machine with a GPU and its Vulkan driver none of this is needed: pip install
# 'offloadctl[webgpu]' is enough.
set -euo pipefail
dest=$(mkdir -p "$1" && cd "$1" && pwd)
arch=$(dpkg --print-architecture)
triplet=$(gcc -dumpmachine 2>/dev/null || echo "$(uname -m)-linux-gnu")
apt_dir="$dest/apt"
mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$dest/debs" "$dest/root"
cat > "$apt_dir/sources.list" <<LIST
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-backports main
LIST
apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o "APT::Architecture=$arch"
  -o "APT::Sandbox::User=root" -o "Debug::NoLocking=1")
apt-get -qq "${apt_opts[@]}" update
# the driver, the libraries it needs newer than bookworm's, the loader, and LLVM for lavapipe
(cd "$dest/debs" && apt-get -qq "${apt_opts[@]}" download \
  mesa-vulkan-drivers/bookworm-backports libdrm2/bookworm-backports libdrm-amdgpu1/bookworm-backports \
  libvulkan1/bookworm libllvm15/bookworm)
for deb in "$dest"/debs/*.deb; do dpkg -x "$deb" "$dest/root"; done
lib="$dest/root/usr/lib/$triplet"
icd=$(ls "$dest"/root/usr/share/vulkan/icd.d/lvp_icd*.json | head -n 1)
sed "s#\"library_path\": \"[^\"]*\"#\"library_path\": \"$lib/libvulkan_lvp.so\"#" "$icd" > "$dest/lvp_icd.json"
cat > "$dest/env" <<ENV
export VK_DRIVER_FILES="$dest/lvp_icd.json"
export LD_LIBRARY_PATH="$lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1
ENV
rm -rf "$dest/debs" "$apt_dir"
echo "software Vulkan driver ready: . $dest/env"
