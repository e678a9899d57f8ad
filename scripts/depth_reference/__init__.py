# The seed 004 depth decoder (depth.py) and the seed 002 quant module (quant.py), re-indented from the stored seeds
# (which lost their line breaks and indentation; scripts/make_depth_fixtures.py checks that every other character
# is unchanged), plus the thin `weights` shim they import. Used only to make the depth decoder's test fixtures.
