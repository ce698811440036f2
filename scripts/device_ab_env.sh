# Sourced (`. scripts/device_ab_env.sh`) by the device A/B scripts (device_put_ab.sh,
# device_ranks_ab.sh), from the repository root, after scripts/device_env.sh: the code
# of this tree ("new") against an earlier commit's mosafs/ unpacked in .abold ("old").
#
#   Here:   rm -rf .abold && mkdir .abold && git archive COMMIT mosafs | tar -x -C .abold
#           (and .abold/ in .git/info/exclude); carry .abold with .whl and .devcarry.
#
# ab_side SIDE: run what follows with SIDE's code. The working directory comes first on
# sys.path (python -m), so each side runs from the directory that holds its own mosafs/;
# ab_home goes back to the repository root.
AB_NEW=$PYTHONPATH
AB_OLD=/tmp/site:$PWD/.abold
AB_ROOT=$PWD
ab_side() {
    if [ "$1" = new ]; then export PYTHONPATH=$AB_NEW; cd "$AB_ROOT" || return 1
    else export PYTHONPATH=$AB_OLD; cd "$AB_ROOT/.abold" || return 1; fi
}
ab_home() { cd "$AB_ROOT" || return 1; }
