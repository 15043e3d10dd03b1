import mujoco, numpy as np
from metaworld.asset_path_utils import full_V3_path_for
m = mujoco.MjModel.from_xml_path(full_V3_path_for("sawyer_xyz/sawyer_reach_v3.xml"))
np.set_printoptions(precision=4, suppress=True)
print(mujoco.__version__, "mjNEQDATA", mujoco.mjNEQDATA, "neq", m.neq, "types", m.eq_type, "\n", m.eq_data)
# a minimal weld with explicit torquescale and relpose to see the layout
xml = """<mujoco><worldbody><body name="a" mocap="true"/><body name="b"><freejoint/><geom size=".1"/></body></worldbody>
<equality><weld body1="a" body2="b" anchor="1 2 3" relpose="4 5 6 1 0 0 0" torquescale="7"/></equality></mujoco>"""
print(mujoco.MjModel.from_xml_string(xml).eq_data)
