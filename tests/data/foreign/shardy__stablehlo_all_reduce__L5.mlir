sdy.mesh @mesh_4 = <["x"=4]>

func.func @manual_all_reduce(
  %arg0: tensor<16x8xi32> {sdy.sharding = #sdy.sharding<@mesh_4, [{"x"}, {}]>})
  -> (tensor<4x8xi32> {sdy.sharding = #sdy.sharding<@mesh_4, [{}, {}]>}) {
  %0 = sdy.manual_computation(%arg0)
    in_shardings=[<@mesh_4, [{"x"}, {}]>]
    out_shardings=[<@mesh_4, [{}, {}]>]
    manual_axes={"x"} (%arg1: tensor<4x8xi32>) {
      %1 = "stablehlo.all_reduce"(%arg1) ({
        ^bb0(%arg2: tensor<i32>, %arg3: tensor<i32>):
          %2 = stablehlo.add %arg2, %arg3 : tensor<i32>
          stablehlo.return %2 : tensor<i32>
      }) {
        replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>,
        channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>,
        use_global_device_ids
      } : (tensor<4x8xi32>) -> tensor<4x8xi32>
      sdy.return %1 : tensor<4x8xi32>
  } : (tensor<16x8xi32>) -> (tensor<4x8xi32>)
  return %0 : tensor<4x8xi32>
}
