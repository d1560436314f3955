sdy.mesh @mesh_2 = <["x"=2]>

func.func @sequential_conv(%arg0: tensor<2x4x4x4xi32>, %arg1: tensor<3x3x4x4xi32>) -> tensor<2x2x2x4xi32> {
  %0 = stablehlo.convolution(%arg0, %arg1)
    dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f],
    window = {stride = [2, 2], pad = [[0, 1], [0, 1]]}
    {
      feature_group_count = 1 : i64,
      batch_group_count = 1 : i64
    } : (tensor<2x4x4x4xi32>, tensor<3x3x4x4xi32>) -> tensor<2x2x2x4xi32>
  return %0 : tensor<2x2x2x4xi32>
}

func.func @parallel_conv(
  %arg0: tensor<2x4x4x4xi32> {sdy.sharding = #sdy.sharding<@mesh_2, [{}, {}, {}, {"x"}]>},
  %arg1: tensor<3x3x4x4xi32> {sdy.sharding = #sdy.sharding<@mesh_2, [{}, {}, {"x"}, {}]>}
) -> (tensor<2x2x2x4xi32> {sdy.sharding = #sdy.sharding<@mesh_2, [{}, {}, {}, {}]>}) {
  %0 = stablehlo.convolution(%arg0, %arg1)
    dim_numbers = [b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f],
    window = {stride = [2, 2], pad = [[0, 1], [0, 1]]}
    {
      feature_group_count = 1 : i64,
      batch_group_count = 1 : i64
    } : (tensor<2x4x4x4xi32>, tensor<3x3x4x4xi32>) -> tensor<2x2x2x4xi32>
  %1 = sdy.all_reduce {"x"} %0 out_sharding=<@mesh_2, [{}, {}, {}, {}]> : tensor<2x2x2x4xi32>
  return %1 : tensor<2x2x2x4xi32>
}
