#!/bin/sh
# libqrt-client's ABI surface: the SONAME carries the SOVERSION, and the
# dynamic symbol table exports the qrt_* C functions of qrt/client.h and
# nothing else (no libstdc++ or nlohmann-json template leaks).
#   check_abi.sh LIB HEADER SOVERSION
set -eu
lib=$1 header=$2 soversion=$3
soname=$(objdump -p "$lib" | awk '$1 == "SONAME" { print $2 }')
if [ "$soname" != "libqrt-client.so.$soversion" ]; then
	echo "SONAME is '$soname', expected libqrt-client.so.$soversion"; exit 1
fi
exported=$(nm -D --defined-only "$lib" | awk '$2 == "T" || $2 == "W" || $2 == "V" || $2 == "u" || $2 == "D" || $2 == "B" { print $3 }' | sed 's/@.*//' | sort)
declared=$(sed -n 's/^QRT_CLIENT_API [^(]*[ *]\(qrt_[a-z_]*\)(.*/\1/p' "$header" | sort)
if [ -z "$declared" ]; then
	echo "no QRT_CLIENT_API declarations found in $header"; exit 1
fi
if [ "$exported" != "$declared" ]; then
	echo "exported symbols differ from the header's declarations:"
	echo "$exported" > /tmp/qrt-abi-exported.$$
	echo "$declared" > /tmp/qrt-abi-declared.$$
	diff /tmp/qrt-abi-declared.$$ /tmp/qrt-abi-exported.$$ || true
	rm -f /tmp/qrt-abi-exported.$$ /tmp/qrt-abi-declared.$$
	exit 1
fi
echo "libqrt-client: SONAME $soname, $(echo "$exported" | wc -l) exported qrt_* symbols, all declared"
