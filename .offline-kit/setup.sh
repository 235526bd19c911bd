# source me: installs the kit into .offline-kit/site and builds pyfuse3 against the kit's libfuse3
K=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
python3 -m pip install -q --no-index --no-deps --target "$K/site" "$K"/whl/*.whl
sed -i "s#^prefix=.*#prefix=$K/root/usr#; s#^libdir=.*#libdir=$K/root/lib/x86_64-linux-gnu#" \
  "$K/root/usr/lib/x86_64-linux-gnu/pkgconfig/fuse3.pc"
export PKG_CONFIG_PATH=$K/root/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=$K/root/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$K/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
SETUPTOOLS_SCM_PRETEND_VERSION=3.5.0 python3 -m pip install -q --no-index --no-deps --no-build-isolation \
  --target "$K/site" "$K"/whl/pyfuse3-*.tar.gz
python3 -c "import pyfuse3, trio; from nvidia import nvcomp; print('offline kit ready: pyfuse3, trio', trio.__version__, 'nvcomp', nvcomp.__version__)"
